//! `nvfipc`: the command-line companion of nvfuser-ipc (store server, local launcher, demo and
//! benchmarks).

mod args;
mod barrier_test;
mod bench;
mod demo;
mod device_buffer;
mod doctor;
mod launch;
mod memory;
mod serve;
mod signals;
mod stats;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// `nvfipc --help`: what the program is, the synopsis of every shown command (each taken from
/// that command's own usage, so the two cannot disagree), the commands, and examples that run as
/// printed.
fn top_help(cli: &clap::Command) -> String {
    let mut usage = String::new();
    for command in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
        let text = command.clone().render_usage().to_string();
        usage.push_str("  ");
        usage.push_str(text.trim_start_matches("Usage:").trim());
        usage.push('\n');
    }
    format!(
        "{{about-with-newline}}
Usage:
{usage}  nvfipc help [COMMAND] | --help | -h | --version

{{all-args}}

Examples:
  nvfipc serve --port 0
  nvfipc launch -n 4 -- nvfipc barrier-test --rounds 10
  nvfipc demo --ranks 4
  nvfipc bench --quick
  nvfipc doctor
"
    )
}

/// nvfipc: store server, local launcher, demo and benchmarks of nvfuser-ipc (nvfipc COMMAND --help
/// shows one command)
#[derive(Parser)]
#[command(
    name = "nvfipc",
    version,
    override_usage = "nvfipc COMMAND [OPTIONS]",
    arg_required_else_help = false
)]
struct Cli {
    /// `None` is a usage error, reported without naming the hidden commands (as clap's own
    /// "requires a subcommand" would).
    #[command(subcommand)]
    command: Option<Command>,
}

/// The command line with every command's help laid out as [`args::COMMAND_HELP`]; an option
/// given twice takes its last value, as scripts that append to a default command line expect.
fn command_line() -> clap::Command {
    let cli = Cli::command();
    let help = top_help(&cli);
    cli.help_template(help)
        .mut_subcommands(|c| c.help_template(args::COMMAND_HELP).args_override_self(true))
}

#[derive(Subcommand)]
enum Command {
    Serve(serve::ServeArgs),
    Launch(launch::LaunchArgs),
    Demo(demo::DemoArgs),
    /// One rank of `demo`, started by it; not for direct use.
    #[command(hide = true, override_usage = "nvfipc demo-rank ...")]
    DemoRank(demo::DemoArgs),
    Bench(bench::BenchArgs),
    /// One rank of `bench`, started by it; not for direct use.
    #[command(hide = true, override_usage = "nvfipc bench-rank ...")]
    BenchRank(bench::RankArgs),
    BarrierTest(barrier_test::BarrierTestArgs),
    Doctor(doctor::DoctorArgs),
    /// The second process of `doctor`'s descriptor-passing probe; not for direct use.
    #[command(hide = true, override_usage = "nvfipc doctor-peer ...")]
    DoctorPeer(doctor::PeerArgs),
    /// Print a completion script for SHELL (e.g. `nvfipc completions bash >
    /// ~/.local/share/bash-completion/completions/nvfipc`).
    #[command(override_usage = "nvfipc completions bash|elvish|fish|powershell|zsh")]
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

/// The command line without its hidden commands (clap_complete would offer them).
fn shown() -> clap::Command {
    let full = command_line();
    let shown = full.get_subcommands().filter(|c| !c.is_hide_set()).cloned();
    clap::Command::new("nvfipc")
        .version(env!("CARGO_PKG_VERSION"))
        .subcommands(shown.collect::<Vec<_>>())
}

fn main() {
    let parsed = command_line()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
        .and_then(|cli| {
            cli.command.ok_or_else(|| {
                command_line().error(
                    clap::error::ErrorKind::MissingSubcommand,
                    "missing command (serve, launch, demo, bench, barrier-test, doctor, completions or \
                     help)",
                )
            })
        });
    let command = match parsed {
        Ok(command) => command,
        Err(e) => {
            // Help and --version go to stdout with status 0; mistakes to stderr with status 2,
            // pointing at the help.
            let usage_error = e.use_stderr();
            let _ = e.print();
            if usage_error {
                eprintln!("Run 'nvfipc --help' for every command.");
            }
            std::process::exit(e.exit_code());
        }
    };
    let code = match command {
        Command::Serve(a) => serve::run(&a),
        Command::Launch(a) => launch::run(&a),
        Command::Demo(a) => demo::run(&a),
        Command::DemoRank(a) => demo::run_rank(&a),
        Command::Bench(a) => bench::run(&a.normalized()),
        Command::BenchRank(a) => bench::run_rank(&a),
        Command::BarrierTest(a) => barrier_test::run(&a),
        Command::Doctor(a) => doctor::run(&a),
        Command::DoctorPeer(a) => doctor::peer::run_peer(&a),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut shown(), "nvfipc", &mut std::io::stdout());
            0
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests;
