"""The control API: requests and replies declared once (requests.py), the UNIX socket server that
decides who may command the arm (server.py), bounded JSON decoding (bounded_json.py) and the
client every app uses (client.py).

May import: calibration, drivers, daemon.system, daemon.config, daemon.control, daemon.data, daemon.policy.
"""
