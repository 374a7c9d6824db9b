//! One module per subcommand; each has an `Args` (clap) and a `run`.

pub mod generate;
pub mod inspect;
pub mod partition;
