//! The fuzzing driver behind `ownerserve fuzz` (stable toolchain, no instrumentation): a
//! structured mutation engine fed with a target's valid seeds and its dictionary of
//! tokens. Each input is a seed or a recently accepted input, mutated by 1–8 operations
//! (bit flips, interesting bytes, dictionary tokens, inserts, deletes, duplications,
//! splices with another seed, truncation) or, now and then, random bytes. Inputs the
//! target accepts go back into a bounded pool, so mutations reach past the first error a
//! parser finds. A panic is caught, reported with the input (hex) and counted: the run
//! fails on any. The targets themselves (the parsers) are wired in by the binary, which
//! sees every crate.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use ownerserve_eval::console::say;

/// What a target did with an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Parsed (worth mutating further).
    Accepted,
    /// Refused with an error, as it should be.
    Refused,
}

/// One fuzz target: its name, valid seeds, dictionary and the function under test. The
/// function must not panic on any input; it may assert properties (an assertion that
/// fails is a panic, and counts).
pub struct Target {
    pub name: &'static str,
    pub seeds: Vec<Vec<u8>>,
    pub dictionary: Vec<Vec<u8>>,
    pub run: Check,
}

/// A target's function under test.
pub type Check = Box<dyn FnMut(&[u8]) -> Verdict>;

/// The result of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub executions: u64,
    pub accepted: u64,
    /// Each panic's message and input (up to the first 10).
    pub panics: Vec<(String, Vec<u8>)>,
    pub panic_count: u64,
}

/// A small, fast PRNG (xorshift64*): the driver needs speed and reproducibility from a
/// seed, not quality.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Bytes that break parsers more often than random ones.
const INTERESTING: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, 0xfe, b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'-', b'0',
    b'9', b'e', b'.', b'\n', b'\r', b' ', 0xc0, 0xdc, 0xdd, 0xde, 0xdf, 0xcf, 0xd3, 0x92,
];

/// Mutations applied to one input: 1–8 operations.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, seeds: &[Vec<u8>], dictionary: &[Vec<u8>]) {
    for _ in 0..=rng.below(8) {
        let len = input.len();
        match rng.below(10) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 | 3 if !dictionary.is_empty() => {
                let token = &dictionary[rng.below(dictionary.len())];
                let at = rng.below(len + 1);
                if rng.below(2) == 0 || len == 0 {
                    input.splice(at..at, token.iter().copied());
                } else {
                    // Overwrite as many bytes as the token has.
                    let end = (at + token.len()).min(len);
                    input.splice(at..end, token.iter().copied());
                }
            }
            4 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                input.splice(at..at, bytes);
            }
            5 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                input.drain(at..at + n);
            }
            6 if len > 0 => {
                // Duplicate a range (repeats nest structures and lengthen lists).
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(256));
                let chunk: Vec<u8> = input[at..at + n].to_vec();
                let to = rng.below(input.len() + 1);
                input.splice(to..to, chunk);
            }
            7 if !seeds.is_empty() => {
                // Splice: this input's head, another seed's tail.
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
            8 if len > 0 => input.truncate(rng.below(len)),
            _ => {
                if len > 0 {
                    let i = rng.below(len);
                    input[i] = input[i].wrapping_add(1 + rng.below(3) as u8);
                }
            }
        }
    }
    // Bounded inputs: a target's cost per input stays small.
    input.truncate(1 << 16);
}

/// Runs `target` on `inputs` inputs from `seed`, printing progress every 10 s.
pub fn run(target: &mut Target, inputs: u64, seed: u64) -> Report {
    let mut rng = Rng::new(seed);
    let mut pool: Vec<Vec<u8>> = Vec::new();
    let mut report = Report::default();
    let started = Instant::now();
    let mut last_print = Instant::now();
    // A caught panic must not print a backtrace per input.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for n in 0..inputs {
        let input = next_input(&mut rng, target, &pool, n);
        let run = &mut target.run;
        match catch_unwind(AssertUnwindSafe(|| run(&input))) {
            Ok(Verdict::Accepted) => {
                report.accepted += 1;
                if pool.len() < 256 {
                    pool.push(input);
                } else {
                    let i = rng.below(pool.len());
                    pool[i] = input;
                }
            }
            Ok(Verdict::Refused) => {}
            Err(payload) => {
                report.panic_count += 1;
                if report.panics.len() < 10 {
                    let msg = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "a panic".to_owned());
                    report.panics.push((msg, input));
                }
            }
        }
        report.executions += 1;
        if last_print.elapsed().as_secs() >= 10 {
            last_print = Instant::now();
            say(&format!(
                "  {}: {} executions, {:.0}/s, {} panics",
                target.name,
                report.executions,
                report.executions as f64 / started.elapsed().as_secs_f64(),
                report.panic_count
            ));
        }
    }
    std::panic::set_hook(hook);
    report
}

/// The next input: every seed once first, then mostly mutations of seeds and accepted
/// inputs, sometimes random bytes.
fn next_input(rng: &mut Rng, target: &Target, pool: &[Vec<u8>], n: u64) -> Vec<u8> {
    if let Some(seed) = usize::try_from(n).ok().and_then(|i| target.seeds.get(i)) {
        return seed.clone();
    }
    if rng.below(100) == 0 {
        let len = rng.below(512);
        return (0..len).map(|_| rng.next_u64() as u8).collect();
    }
    let base = if !pool.is_empty() && rng.below(2) == 0 {
        &pool[rng.below(pool.len())]
    } else if target.seeds.is_empty() {
        return Vec::new();
    } else {
        &target.seeds[rng.below(target.seeds.len())]
    };
    let mut input = base.clone();
    mutate(rng, &mut input, &target.seeds, &target.dictionary);
    input
}

/// Lowercase hex of `bytes` (a panic's input, printed to reproduce it).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_target_is_caught_counted_and_reported_with_its_input() {
        let mut t = Target {
            name: "t",
            seeds: vec![b"ok".to_vec()],
            dictionary: vec![b"boom".to_vec()],
            run: Box::new(|input| {
                assert!(!input.windows(4).any(|w| w == b"boom"), "found the bomb");
                Verdict::Accepted
            }),
        };
        let r = run(&mut t, 5_000, 7);
        assert_eq!(r.executions, 5_000);
        assert!(r.panic_count > 0, "the dictionary token is inserted");
        assert_eq!(r.panics[0].0, "found the bomb");
        assert!(r.panics[0].1.windows(4).any(|w| w == b"boom"));
        assert_eq!(r.accepted + r.panic_count, 5_000);
    }

    #[test]
    fn the_same_seed_gives_the_same_inputs() {
        let gen = |seed| {
            let mut rng = Rng::new(seed);
            let mut input = b"{\"a\":[1,2,3]}".to_vec();
            mutate(
                &mut rng,
                &mut input,
                &[b"xyz".to_vec()],
                &[b"null".to_vec()],
            );
            input
        };
        assert_eq!(gen(3), gen(3));
        assert_ne!(gen(3), gen(4));
    }
}
