"""The composition root: the only place that names concrete arms and builds the daemon from its
configuration: arms -> control loop -> control socket, with the recorder, the policy, the cameras,
the console's verbs and the Rerun child attached through the context (context.py).

May import: calibration, drivers, daemon.system, daemon.config, daemon.control, daemon.data, daemon.policy, daemon.api.
"""
