//! Work over a slice in a few shares side by side, one thread a share but
//! the first: where thousands of paths are `stat`ed (a per-item stage's
//! inputs, a fresh proof's files), the `stat`s scale with cores.

/// How many shares `len` items make at no fewer than `at_least` a share:
/// one a core, at most four (fewer than 2 means no thread).
pub fn shares_for(len: usize, at_least: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(len / at_least)
        .min(4)
}

/// `work` done over `items` in `shares` shares (each given the index of its
/// first item and its items), its answers in the shares' order. A share
/// whose thread cannot be started is done on this one.
pub fn in_shares<T: Sync, R: Send>(
    items: &[T],
    shares: usize,
    name: &str,
    work: impl Fn(usize, &[T]) -> R + Sync,
) -> Vec<R> {
    if shares < 2 {
        return vec![work(0, items)];
    }
    let share = items.len().div_ceil(shares);
    let work = &work;
    std::thread::scope(|scope| {
        let mut parts = items
            .chunks(share)
            .enumerate()
            .map(|(n, part)| (n * share, part));
        let (first, mine) = parts.next().unwrap_or((0, &[]));
        let theirs: Vec<_> = parts
            .map(|(at, part)| {
                std::thread::Builder::new()
                    .name(name.to_owned())
                    .spawn_scoped(scope, move || work(at, part))
                    .map_err(|_| (at, part))
            })
            .collect();
        let mut done = vec![work(first, mine)];
        for thread in theirs {
            done.push(match thread {
                Ok(handle) => match handle.join() {
                    Ok(answer) => answer,
                    Err(panic) => std::panic::resume_unwind(panic),
                },
                Err((at, part)) => work(at, part),
            });
        }
        done
    })
}
