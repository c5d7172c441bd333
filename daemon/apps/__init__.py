"""What operators run: the `so101d` CLI (cli.py, one module per subcommand in commands/), the browser
console (console/) and the Rerun viewer (rerun_stream.py); each a client of the control API, or, for
`run` and `demo`, the service itself.

May import: calibration, drivers, daemon.system, daemon.config, daemon.control, daemon.data, daemon.policy, daemon.api, daemon.service.
"""
