"""The ``satmon`` command line: one file per subcommand, each with a ``main(args)``."""
