//! One module per subcommand; each has an `Args` (clap) and a `run`.
