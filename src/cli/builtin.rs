//! `cairn builtin NAME@VERSION INVOCATION`: what a `uses = "NAME"` stage
//! runs. Hidden: the engine writes the invocation.

use super::args::BuiltinArgs;
use super::error::{CliError, exit};

pub fn builtin(args: &BuiltinArgs) -> Result<(), CliError> {
    match crate::builtins::run(&args.name, &args.invocation) {
        Ok(summary) => {
            outln!("{summary}");
            Ok(())
        }
        Err(error) => {
            errln!("error: {}: {error}", args.name);
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                errln!("  caused by: {cause}");
                source = cause.source();
            }
            Err(CliError::Exit(exit::STAGE_FAILED))
        }
    }
}
