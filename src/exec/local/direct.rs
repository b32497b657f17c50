//! Simple shell commands run without a shell.
//!
//! For a script like `python3 score.py --k=5 'a b' > out/1.json`, `sh -c`
//! only opens the redirected files and executes one program; cairn does the
//! same itself, as GNU make does for plain commands, and a command costs one
//! process instead of two (dash's start-up is about half of a small
//! command's time). Anything the shell would interpret otherwise keeps the
//! shell: a script is run directly only when cairn can tell exactly what the
//! shell would do with it, and whatever cairn cannot do as the shell would
//! (a file that will not open, a program that will not start) is left to
//! the shell, so its effects and its messages are the shell's.
//!
//! What a direct command may hold:
//! - words of plain characters (letters, digits, `_ . / - + , : @ % =`), with
//!   `'…'` quoted parts and backslash-escaped characters (no `=` in the
//!   first word: that would be an assignment);
//! - redirections of the standard descriptors to files: `<`, `>`, `>>`
//!   (optionally after `0`, `1` or `2`), and `>&1` / `>&2` after `1` or `2`;
//! - a first word that is not a shell builtin or keyword, naming a program
//!   the shell would execute by the same path: a path written with a `/`,
//!   or one found in an absolute directory of the command's `PATH` (a
//!   script gets that path as its `$0`);
//! - an environment the shell would pass on unchanged (it sets `PWD`,
//!   `PPID`, `OPTIND` and `IFS` itself and drops names that are not shell
//!   names).
//!
//! `setsid` is left to the shell: cairn starts a command as the leader of
//! its own process group, which the shell is when it runs one, and
//! `setsid` forks when it leads a group (so returns at once). A program
//! that itself calls `setsid()` fails as a group's leader; one that
//! signals its whole group does not kill the shell that would report it.
//! These are the differences left.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What `sh -c` would do for a simple command.
#[derive(Debug, PartialEq, Eq)]
pub struct Direct {
    /// The program, found on the command's `PATH` as the shell finds it.
    pub program: PathBuf,
    /// Its arguments, the first as written (the shell's `argv[0]`).
    pub argv: Vec<String>,
    /// The redirections, in the order the shell makes them.
    pub redirects: Vec<Redirect>,
    /// What the shell exports as `PWD`: the working directory, resolved.
    pub pwd: OsString,
}

/// One redirection of a standard descriptor (0, 1 or 2).
#[derive(Debug, PartialEq, Eq)]
pub struct Redirect {
    pub fd: usize,
    pub to: Target,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// `<`: the file, opened for reading.
    Read(PathBuf),
    /// `>` (truncated) or `>>` (appended to): the file, created if missing.
    Write { path: PathBuf, append: bool },
    /// `>&N`: whatever descriptor N is at this point.
    Copy(usize),
}

/// The shell's builtins and keywords: a command naming one is run by the
/// shell, whose builtin may differ from the program of that name (dash's
/// `echo` expands backslashes; coreutils' does not).
const SHELL_WORDS: &[&str] = &[
    ".", ":", "[", "alias", "bg", "break", "cd", "chdir", "command", "continue", "echo", "eval",
    "exec", "exit", "export", "fc", "fg", "getopts", "hash", "jobs", "kill", "local", "printf",
    "pwd", "read", "readonly", "return", "set", "shift", "test", "times", "trap", "type", "ulimit",
    "umask", "unalias", "unset", "wait", "if", "then", "else", "elif", "fi", "for", "while",
    "until", "do", "done", "case", "esac", "function", "select", "time", "!", "source", "{", "}",
    "in", "true", "false",
];

/// Programs left to the shell though they are not its own (see the module
/// documentation).
const LEFT_TO_THE_SHELL: &[&str] = &["setsid"];

/// Variables the shell sets whatever the environment says (`PWD` only
/// when the declared one names another directory: cairn leaves that check
/// to the shell).
const SHELL_VARIABLES: &[&str] = &["PWD", "PPID", "OPTIND", "IFS"];

/// What the shell would do with `script`, run in `cwd` with the
/// environment `env`, if it is a simple command (see the module
/// documentation).
pub fn parse(script: &str, env: &[(String, String)], cwd: &Path) -> Option<Direct> {
    let (argv, redirects) = lex(script)?;
    let program = argv.first()?;
    if program.contains('=')
        || SHELL_WORDS.contains(&program.as_str())
        || LEFT_TO_THE_SHELL.contains(&program.as_str())
    {
        return None;
    }
    let shell_name = |name: &str| {
        name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    if env
        .iter()
        .any(|(name, _)| SHELL_VARIABLES.contains(&name.as_str()) || !shell_name(name))
    {
        return None;
    }
    let program = program_as_the_shell_finds_it(program, env, cwd)?;
    let pwd = std::fs::canonicalize(cwd).ok()?.into_os_string();
    let redirects = redirects
        .into_iter()
        .map(|(fd, to)| Redirect {
            fd,
            to: match to {
                Target::Read(path) => Target::Read(cwd.join(path)),
                Target::Write { path, append } => Target::Write {
                    path: cwd.join(path),
                    append,
                },
                copy => copy,
            },
        })
        .collect();
    Some(Direct {
        program,
        argv,
        redirects,
        pwd,
    })
}

type Lexed = (Vec<String>, Vec<(usize, Target)>);

/// The words and redirections of a simple command, or `None` for anything
/// else.
fn lex(script: &str) -> Option<Lexed> {
    let mut words = Vec::new();
    let mut redirects = Vec::new();
    let mut chars = script.chars().peekable();
    loop {
        while chars.next_if(|&c| c == ' ' || c == '\t').is_some() {}
        let Some(&c) = chars.peek() else { break };
        if c == '<' || c == '>' {
            redirects.push(redirect(None, &mut chars)?);
            continue;
        }
        let (word, quoted) = word(&mut chars)?;
        // `2>out`: a number of digits alone just before a redirection
        // names the descriptor.
        if !quoted && matches!(chars.peek(), Some('<' | '>')) {
            let fd = match word.as_str() {
                "0" => 0,
                "1" => 1,
                "2" => 2,
                _ if word.bytes().all(|b| b.is_ascii_digit()) => return None,
                _ => {
                    words.push(word);
                    continue;
                }
            };
            redirects.push(redirect(Some(fd), &mut chars)?);
            continue;
        }
        words.push(word);
    }
    Some((words, redirects))
}

type Chars<'a> = std::iter::Peekable<std::str::Chars<'a>>;

/// One word: plain characters, `'…'` and backslash escapes, up to a blank,
/// a redirection or the end. Whether any of it was quoted comes back too.
fn word(chars: &mut Chars<'_>) -> Option<(String, bool)> {
    let plain = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '_' | '.' | '/' | '-' | '+' | ',' | ':' | '@' | '%' | '=')
    };
    let mut word = String::new();
    let mut quoted = false;
    while let Some(&c) = chars.peek() {
        match c {
            ' ' | '\t' | '<' | '>' => break,
            '\'' => {
                chars.next();
                quoted = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                chars.next();
                quoted = true;
                match chars.next()? {
                    // A line continuation.
                    '\n' => return None,
                    c => word.push(c),
                }
            }
            c if plain(c) => {
                chars.next();
                word.push(c);
            }
            _ => return None,
        }
    }
    Some((word, quoted))
}

/// A redirection (its operator next in `chars`) of `fd`, or of the
/// operator's default descriptor.
fn redirect(fd: Option<usize>, chars: &mut Chars<'_>) -> Option<(usize, Target)> {
    let read = chars.next()? == '<';
    if read {
        // `<<`, `<&`, `<>`: not a plain read.
        if matches!(chars.peek(), Some('<' | '&' | '>')) {
            return None;
        }
    } else if chars.next_if_eq(&'&').is_some() {
        let fd = fd.unwrap_or(1);
        let from = match chars.next()? {
            '1' => 1,
            '2' => 2,
            _ => return None,
        };
        // The copy's end: `2>&1 x`, not `2>&12`, nor `2>&1>x` (where the
        // `1` would be the next redirection's descriptor).
        if fd == 0 || !matches!(chars.peek(), None | Some(' ' | '\t')) {
            return None;
        }
        return Some((fd, Target::Copy(from)));
    }
    let append = !read && chars.next_if_eq(&'>').is_some();
    // `>|` (clobber) and the like.
    if matches!(chars.peek(), Some('|' | '&' | '<' | '>')) {
        return None;
    }
    while chars.next_if(|&c| c == ' ' || c == '\t').is_some() {}
    let (target, quoted) = word(chars)?;
    // `>2>x`: digits just before a redirection are its descriptor, and
    // this one has no file.
    let descriptor = !quoted && target.bytes().all(|b| b.is_ascii_digit());
    if target.is_empty() || descriptor && matches!(chars.peek(), Some('<' | '>')) {
        return None;
    }
    let path = PathBuf::from(target);
    Some(if read {
        (fd.unwrap_or(0), Target::Read(path))
    } else {
        (fd.unwrap_or(1), Target::Write { path, append })
    })
}

/// The path the shell would execute `program` by: as written if it holds
/// a `/`, else its first executable file in the directories of the
/// command's own `PATH`, as `DIR/program`. `None` if the shell would find
/// none, or would find it through an empty or relative entry of `PATH`
/// (a path to execute relative to the working directory, which the
/// standard library would look up on `PATH` again).
///
/// Spawning a path lets the standard library use `posix_spawn` (a program
/// to look up on a changed `PATH` makes it fork instead, which costs a
/// copy of cairn's page tables per command).
pub fn program_as_the_shell_finds_it(
    program: &str,
    env: &[(String, String)],
    cwd: &Path,
) -> Option<PathBuf> {
    if program.contains('/') {
        return is_executable_file(&cwd.join(program)).then(|| PathBuf::from(program));
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())?;
    for dir in path.split(':') {
        // (An empty entry is the working directory.)
        let candidate = if dir.is_empty() {
            program.to_owned()
        } else {
            format!("{dir}/{program}")
        };
        if is_executable_file(&cwd.join(&candidate)) {
            return Path::new(dir)
                .is_absolute()
                .then(|| PathBuf::from(candidate));
        }
    }
    None
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Vec<(String, String)> {
        vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())]
    }

    fn parsed(script: &str) -> Option<Direct> {
        parse(script, &env(), Path::new("/"))
    }

    fn write(path: &str, append: bool) -> Target {
        Target::Write {
            path: PathBuf::from(path),
            append,
        }
    }

    #[test]
    fn simple_commands_are_run_without_a_shell() {
        let direct = parsed("cp in/1.txt out/1.txt").unwrap();
        assert!(
            direct.program.ends_with("cp"),
            "{}",
            direct.program.display()
        );
        assert_eq!(direct.argv, ["cp", "in/1.txt", "out/1.txt"]);
        assert!(direct.redirects.is_empty());
        assert_eq!(direct.pwd, "/");

        let direct = parsed("cat 'b c.txt' x\\ y --n=3 ''>out 2>&1 <in 2>>err 1>&2 0<in2").unwrap();
        assert_eq!(direct.argv, ["cat", "b c.txt", "x y", "--n=3", ""]);
        let redirects: Vec<(usize, Target)> =
            direct.redirects.into_iter().map(|r| (r.fd, r.to)).collect();
        assert_eq!(
            redirects,
            [
                (1, write("/out", false)),
                (2, Target::Copy(1)),
                (0, Target::Read(PathBuf::from("/in"))),
                (2, write("/err", true)),
                (1, Target::Copy(2)),
                (0, Target::Read(PathBuf::from("/in2"))),
            ]
        );
    }

    #[test]
    fn anything_the_shell_would_interpret_otherwise_keeps_the_shell() {
        for script in [
            "echo $HOME",
            "ls *.txt",
            "ls a?",
            "a; b",
            "a && b",
            "a | b",
            "sleep 1 &",
            "cat \"x\"",
            "cat ~/x",
            "cat a#b",
            "cat a\\\nb",
            "cat 'unterminated",
            "cd dir",
            "exit 3",
            "echo plain words",
            "printf x",
            "true",
            "false > out",
            "setsid sleep 1",
            "X=1 env",
            "> out",
            "cat >2>x",
            "cat 12>x",
            "cat >|x",
            "cat <<EOF",
            "cat <&0",
            "cat <>x",
            "cat 2>&-",
            "cat >&x",
            "cat 0>&1",
            "cat 2>&12",
            "cat >&2>&2",
            "cat 2>&1>out",
            "cat >",
            "no-such-program-anywhere x",
        ] {
            assert_eq!(parsed(script), None, "{script}");
        }
    }

    #[test]
    fn variables_the_shell_sets_or_drops_keep_the_shell() {
        for name in ["PWD", "PPID", "OPTIND", "IFS", "A-B", "1X", "a.b", "é"] {
            let mut env = env();
            env.push((name.to_owned(), "/".to_owned()));
            assert_eq!(parse("cat x", &env, Path::new("/")), None, "{name}");
        }
    }

    #[test]
    fn programs_are_executed_by_the_path_the_shell_would_use() {
        let found = |program: &str, path: &str| {
            let env = vec![("PATH".to_owned(), path.to_owned())];
            program_as_the_shell_finds_it(program, &env, Path::new("/"))
        };
        assert_eq!(
            found("cat", "/usr/bin/:/bin"),
            Some(PathBuf::from("/usr/bin//cat"))
        );
        assert_eq!(
            found("usr/bin/cat", "/nowhere"),
            Some(PathBuf::from("usr/bin/cat"))
        );
        assert_eq!(found("cat", "/nowhere:usr/bin:/bin"), None);
        assert_eq!(found("cat", "/nowhere"), None);
        assert_eq!(found("cat", ":/bin"), Some(PathBuf::from("/bin/cat")));
    }
}
