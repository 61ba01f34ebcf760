//! What the commands' clap definitions share: value parsers that say what a value must be, the
//! help layout, and (for the parsers' tests) parsing one command's arguments alone.

use std::time::Duration;

/// Every command's help starts with its usage line(s), as the README's CLI section shows them.
pub const COMMAND_HELP: &str = "\
Usage:
  {usage}

{about-with-newline}
{all-args}{after-help}";

/// A count of at least `min`, with a message that names the minimum.
fn at_least(value: &str, min: u64) -> Result<u64, String> {
    let n: u64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if n < min {
        return Err(format!("must be at least {min}"));
    }
    Ok(n)
}

/// A count of at least 1.
pub fn positive(value: &str) -> Result<u64, String> {
    at_least(value, 1)
}

/// A count of at least 1 (as `usize`).
pub fn positive_count(value: &str) -> Result<usize, String> {
    Ok(at_least(value, 1)? as usize)
}

/// A rank count of at least 2 (a ring needs two).
pub fn two_or_more(value: &str) -> Result<usize, String> {
    Ok(at_least(value, 2)? as usize)
}

/// A positive number of milliseconds.
pub fn positive_ms(value: &str) -> Result<Duration, String> {
    Ok(Duration::from_millis(at_least(value, 1)?))
}

/// Milliseconds, 0 included.
pub fn millis(value: &str) -> Result<Duration, String> {
    Ok(Duration::from_millis(at_least(value, 0)?))
}

/// Parses `args` as the arguments of one command (for the parsers' tests).
#[cfg(test)]
pub fn parse<A: clap::Args>(args: &[&str]) -> Result<A, clap::Error> {
    use clap::{FromArgMatches, Parser};
    #[derive(Parser)]
    struct One<A: clap::Args> {
        #[command(flatten)]
        args: A,
    }
    let matches = <One<A> as clap::CommandFactory>::command()
        .no_binary_name(true)
        .try_get_matches_from(args)?;
    One::<A>::from_arg_matches(&matches).map(|one| one.args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_name_what_they_must_be() {
        assert_eq!(positive("7"), Ok(7));
        assert_eq!(positive("0").unwrap_err(), "must be at least 1");
        assert_eq!(two_or_more("x").unwrap_err(), "\"x\" is not a number");
        assert_eq!(millis("0"), Ok(Duration::ZERO));
        assert!(positive_ms("0").is_err());
    }
}
