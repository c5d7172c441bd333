"""Simulated followers over ZeroMQ: the protocol, the daemon-side client, MuJoCo and LeIsaac servers."""
