//! The `cairn` command line.

/// `println!` to stdout that returns write errors (a closed pipe is then a
/// quiet success, see `cli::main`) instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// `print!` to stdout that returns write errors.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// `eprintln!` that ignores write errors: a closed terminal or pipe on
/// stderr must neither panic cairn nor stop it from recording finished work.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// `eprint!` that ignores write errors.
macro_rules! err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod args;
mod audit;
mod builtin;
mod bundle;
mod dag;
mod error;
mod fresh_run;
mod gc;
mod import;
mod lineage;
mod locked;
mod log;
mod progress;
mod provenance;
mod render;
mod report;
mod resample;
mod run;
mod run_events;
mod shared_cache;
mod show;
mod status;
mod targets;
mod verify_lock;
mod why;
mod workspace;

use std::io::ErrorKind;
use std::process::ExitCode;

use clap::Parser;

pub use args::Cli;
pub use error::{CliError, exit};

/// Parses the command line, runs it, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() {
                exit::BAD_INPUT
            } else {
                exit::OK
            };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    init_tracing(cli.global.verbose);
    match dispatch(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Output(e)) if e.kind() == ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            report(&error);
            ExitCode::from(error.exit_code())
        }
    }
}

fn dispatch(cli: &Cli) -> Result<(), CliError> {
    use args::Command;
    match &cli.command {
        Command::Run(args) => run::run(&cli.global, args),
        Command::Status(args) => status::status(&cli.global, args),
        Command::Why(args) => why::why(&cli.global, args),
        Command::Dag(args) => dag::dag(&cli.global, args),
        Command::Log(args) => log::log(&cli.global, args),
        Command::Report(args) => report::report(&cli.global, args),
        Command::Show(args) => show::show(&cli.global, args),
        Command::Gc(args) => gc::gc(&cli.global, args),
        Command::Resample(args) => resample::resample(&cli.global, args),
        Command::Import(args) => import::import(&cli.global, args),
        Command::Push(args) => shared_cache::push(&cli.global, args),
        Command::Pull(args) => shared_cache::pull(&cli.global, args),
        Command::Key(args) => shared_cache::key(&cli.global, args),
        Command::Audit(args) => audit::audit_cmd(&cli.global, args),
        Command::Provenance(args) => provenance::provenance(&cli.global, args),
        Command::Verify(args) => bundle::verify(&cli.global, args),
        Command::Register(args) => bundle::register(args),
        Command::Builtin(args) => builtin::builtin(args),
    }
}

fn report(error: &CliError) {
    match error {
        CliError::Exit(_) => {}
        CliError::Manifest(crate::manifest::LoadError::Invalid(errors)) => {
            err!("{}", errors.render(render::stderr_color()));
        }
        CliError::Usage { message, help } => {
            errln!("error: {message}");
            if let Some(help) = help {
                errln!("  help: {help}");
            }
        }
        other => {
            errln!("error: {other}");
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                errln!("  caused by: {cause}");
                source = cause.source();
            }
        }
    }
}

fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "cairn=info",
        _ => "cairn=debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| progress::LogWriter)
        .with_ansi(render::stderr_color())
        .with_target(false)
        .log_internal_errors(false)
        .try_init();
}
