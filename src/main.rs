fn main() -> std::process::ExitCode {
    cairn::cli::main()
}
