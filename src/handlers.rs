//! Handlers configured on the command line: `--handler TASK=exec:COMMAND`
//! and `--handler TASK=sql:[SCHEMA.]FUNCTION`.

pub mod exec;
pub mod sql;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::handler::Handler;

/// Parse one `--handler TASK=KIND:SPEC` flag into a task name and a handler.
pub fn parse_flag(flag: &str) -> Result<(String, Arc<dyn Handler>)> {
    parse_flag_with(flag, exec::EXEC_STDOUT_MAX_DEFAULT)
}

/// [`parse_flag`], with exec handlers keeping at most `exec_stdout_max`
/// bytes of stdout as their result (`--exec-stdout-max`).
pub fn parse_flag_with(flag: &str, exec_stdout_max: usize) -> Result<(String, Arc<dyn Handler>)> {
    parse_flag_with_env(flag, exec_stdout_max, &[])
}

/// [`parse_flag_with`], with exec handlers also passing the `exec_env`
/// variables of the worker's environment through unchanged (`--exec-env`;
/// see [`exec::check_passed_env`] for the names refused).
pub fn parse_flag_with_env(
    flag: &str,
    exec_stdout_max: usize,
    exec_env: &[String],
) -> Result<(String, Arc<dyn Handler>)> {
    let usage =
        "expected --handler TASK=exec:COMMAND [ARGS] or --handler TASK=sql:[SCHEMA.]FUNCTION";
    let (task, spec) = flag
        .split_once('=')
        .ok_or_else(|| Error::Config(format!("--handler {flag:?}: missing `=`; {usage}")))?;
    if task.is_empty() {
        return Err(Error::Config(format!(
            "--handler {flag:?}: empty task name; {usage} (use `*` for every task)"
        )));
    }
    let (kind, rest) = spec
        .split_once(':')
        .ok_or_else(|| Error::Config(format!("--handler {flag:?}: missing kind; {usage}")))?;
    let handler: Arc<dyn Handler> = match kind {
        "exec" => Arc::new(
            exec::ExecHandler::parse(rest)?
                .with_stdout_max(exec_stdout_max)
                .with_passed_env(exec_env)?,
        ),
        "sql" => Arc::new(sql::SqlHandler::parse(rest)?),
        other => {
            return Err(Error::Config(format!(
                "--handler {flag:?}: unknown kind {other:?}; {usage}"
            )))
        }
    };
    Ok((task.to_string(), handler))
}
