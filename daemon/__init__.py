"""The so101d daemon, in layers (bottom to top; each may import only the ones below it):

system   the operating system: logs, realtime, sd_notify, terminals, serial ports
config   the TOML configuration and reload
control  the loop: period and cycle, arms, target sources, safety, faults
data     the dataset: schema, recorder, writer, store, tools, HDF5 interop
policy   LeRobot policies served beside the servos
api      the control API: typed messages, socket server, client
service  the composition root: builds the daemon from its configuration
apps     the CLI, the browser console, the Rerun viewer

``.ci/check_imports.py`` holds the order (``--graph`` prints the arrows).
"""
