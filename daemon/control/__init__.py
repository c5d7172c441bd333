"""The control loop and what it drives: the period and the read -> update -> write cycle (loop.py),
the arms and their links, the target sources (the leader, and the seams in seams.py that a policy or
any other source implements), safety as a pure function (safety.py), fault classification
(faults.py) and the status snapshot (snapshot.py).

Hardware is reached only through drivers' arm interface; nothing here knows serial bytes, sockets,
datasets or policies.

May import: calibration, drivers, daemon.system, daemon.config.
"""
