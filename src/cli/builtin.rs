//! `cairn builtin NAME@VERSION INVOCATION`: what a `uses = "NAME"` stage
//! runs. Hidden: the engine writes the invocation.

use super::args::BuiltinArgs;
use super::error::{CliError, exit};

pub fn builtin(args: &BuiltinArgs) -> Result<(), CliError> {
    let outcome = match crate::builtins::prepare(&args.name, &args.invocation) {
        // The one that reads the workspace runs at this layer.
        Ok(("lineage", invocation)) => super::lineage::run(&invocation),
        Ok(_) => crate::builtins::run(&args.name, &args.invocation),
        Err(error) => Err(error),
    };
    match outcome {
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
            Err(CliError::Exit(match error {
                crate::builtins::BuiltinError::Infra(_) => exit::INFRA,
                _ => exit::STAGE_FAILED,
            }))
        }
    }
}
