//! One module per subcommand; each has an `Args` (clap) and a `run`.

pub mod inspect;
pub mod partition;
