//! `onebit-pipe`: parse the command line, set up logs and progress, call one library function per
//! subcommand, and map the outcome to an exit code.
//!
//! Exit codes: 0 done; 1 the input was refused or failed verification; 2 anything else (bad usage,
//! I/O, a capability that is not built).

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let server = matches!(args.command, cli::Command::Serve(_));
    cli::init_logging(&args.global, server);
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", cli::render(&e));
            ExitCode::from(cli::exit_code_of(&e))
        }
    }
}
