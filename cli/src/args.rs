//! What the commands' clap definitions share: value parsers that say what a value must be, the
//! help layout, and (for the parsers' tests) parsing one command's arguments alone.

use std::time::Duration;

/// Every command's help starts with its usage line(s), as the README's CLI section shows them.
pub const COMMAND_HELP: &str = "\
Usage:
  {usage}

{about-with-newline}
{all-args}{after-help}";

use nvfuser_ipc::tools::config::MAX_WORLD_SIZE;

/// A count of at least `min`, with a message that names the minimum.
fn at_least(value: &str, min: u64) -> Result<u64, String> {
    if !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_digit())
        && value.parse::<u64>().is_err()
    {
        return Err("is far too large".to_string());
    }
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

/// A number of ranks of at least `min` and at most [`MAX_WORLD_SIZE`] (the library's limit,
/// `NVFIPC_MAX_WORLD_SIZE`).
fn ranks_at_least(value: &str, min: u64) -> Result<usize, String> {
    let n = at_least(value, min).map_err(|e| {
        if e == "is far too large" {
            format!("must be at most {MAX_WORLD_SIZE} ranks (NVFIPC_MAX_WORLD_SIZE)")
        } else {
            e
        }
    })?;
    if n > MAX_WORLD_SIZE as u64 {
        return Err(format!(
            "must be at most {MAX_WORLD_SIZE} ranks (NVFIPC_MAX_WORLD_SIZE)"
        ));
    }
    Ok(n as usize)
}

/// A number of ranks: 1 to [`MAX_WORLD_SIZE`].
pub fn world_size(value: &str) -> Result<usize, String> {
    ranks_at_least(value, 1)
}

/// A number of ranks of a ring: 2 to [`MAX_WORLD_SIZE`].
pub fn ring_size(value: &str) -> Result<usize, String> {
    ranks_at_least(value, 2)
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
mod tests;
