"""The so101d daemon: configuration, the control loop, safety, the control socket and the CLI."""
