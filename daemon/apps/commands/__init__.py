"""One module per `so101d` subcommand: add_arguments(parser) and run(args) -> int."""
