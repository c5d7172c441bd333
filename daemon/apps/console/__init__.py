"""The browser console (`so101d console`): its own process, a client of the daemon's control socket."""
