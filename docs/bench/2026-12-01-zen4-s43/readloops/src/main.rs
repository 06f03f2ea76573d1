// Memory read vs copy bandwidth micro-benchmark (session forty-three; a scratch program kept with its output, not part of the build).
// Usage: rb [threads=2] [rounds=8] [filter1,filter2,...]
//   filter: only variants whose name contains one of the substrings (copy baseline always runs).
use std::arch::x86_64::*;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

const MIB: usize = 1 << 20;
const BUF: usize = 512 * MIB;
const PASSES: usize = 5;

#[derive(Clone, Copy)]
struct Buf(usize); // address; Send+Sync

fn map(len: usize, huge: bool) -> Buf {
    let align = 2 * MIB;
    unsafe {
        let raw = libc::mmap(
            std::ptr::null_mut(),
            len + align,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert!(raw != libc::MAP_FAILED);
        let p = (raw as usize + align - 1) & !(align - 1);
        let adv = if huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        assert_eq!(libc::madvise(p as *mut libc::c_void, len, adv), 0);
        let w = std::slice::from_raw_parts_mut(p as *mut u64, len / 8);
        for (i, x) in w.iter_mut().enumerate() {
            *x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        }
        Buf(p)
    }
}

fn anon_huge_kib() -> String {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    s.lines().filter(|l| l.starts_with("AnonHugePages") || l.starts_with("Anonymous")).collect::<Vec<_>>().join(" | ")
}

fn pin(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

// ---------------- kernels ----------------

/// The "current" loop: 4 contiguous sequential streams, u64 wrapping sums of one cache line of each stream in turn.
fn cur_loop(p: *const u8, len: usize, _d: usize) -> u64 {
    // Equivalent of the well-autovectorized scalar loop
    //   for i in lines { for s in 0..4 { for k in 0..8 { acc[k] = acc[k].wrapping_add(stream_s[i][k]) } } }
    // i.e. one 512-bit vpaddq per cache line, streams visited in turn, one line each.
    // (Written with intrinsics because LLVM's loop vectorizer turned the plain-Rust form into
    //  vpgatherqq across lines on znver4, which ran at ~6.5 GB/s.)
    unsafe {
        let q = len / 4;
        let lines = q / 64;
        let mut acc = _mm512_setzero_si512();
        for i in 0..lines {
            for s in 0..4 {
                acc = _mm512_add_epi64(acc, _mm512_load_si512(p.add(s * q + i * 64) as *const _));
            }
        }
        let a: [u64; 8] = std::mem::transmute(acc);
        a.iter().fold(0u64, |x, y| x.wrapping_add(*y))
    }
}

const MODE_XOR: u8 = 0; // _mm512_load_si512 + xor (no FP latency chains)
const MODE_ADDPS: u8 = 1; // _mm512_load_ps + _mm512_add_ps into 8 accumulators
const MODE_NT: u8 = 2; // _mm512_stream_load_si512 + xor

/// S contiguous sequential streams; per iteration 4 cache lines (256 B) from each stream.
/// Optional software prefetch HINT at `dist` bytes ahead in each stream (one prefetch per line).
#[inline(always)]
unsafe fn avx_read<const S: usize, const HINT: i32, const PF: bool, const MODE: u8>(p: *const u8, len: usize, dist: usize) -> u64 {
    const U: usize = 4;
    let slen = len / S;
    let iters = slen / (U * 64);
    let mut x = [_mm512_setzero_si512(); 4];
    let mut f = [_mm512_setzero_ps(); 8];
    let mut off = 0usize;
    for _ in 0..iters {
        for s in 0..S {
            let b = p.add(s * slen + off);
            if PF {
                for u in 0..U {
                    _mm_prefetch::<HINT>(b.wrapping_add(dist + u * 64) as *const i8);
                }
            }
            for u in 0..U {
                let a = b.add(u * 64);
                match MODE {
                    MODE_XOR => x[u] = _mm512_xor_si512(x[u], _mm512_load_si512(a as *const _)),
                    MODE_NT => x[u] = _mm512_xor_si512(x[u], _mm512_stream_load_si512(a as *const _)),
                    _ => {
                        let k = (s * U + u) & 7;
                        f[k] = _mm512_add_ps(f[k], _mm512_load_ps(a as *const f32));
                    }
                }
            }
        }
        off += U * 64;
    }
    let mut r = _mm512_xor_si512(_mm512_xor_si512(x[0], x[1]), _mm512_xor_si512(x[2], x[3]));
    for k in 0..8 {
        r = _mm512_xor_si512(r, _mm512_castps_si512(f[k]));
    }
    let a: [u64; 8] = std::mem::transmute(r);
    a.iter().fold(0, |p, q| p ^ q)
}

type Kfn = fn(*const u8, usize, usize) -> u64;

fn k_wrap<const S: usize, const HINT: i32, const PF: bool, const MODE: u8>(p: *const u8, len: usize, d: usize) -> u64 {
    unsafe { avx_read::<S, HINT, PF, MODE>(p, len, d) }
}

fn kernel_s<const S: usize>(hint: Option<i32>, mode: u8) -> Kfn {
    match (hint, mode) {
        (None, MODE_XOR) => k_wrap::<S, 0, false, MODE_XOR>,
        (None, MODE_ADDPS) => k_wrap::<S, 0, false, MODE_ADDPS>,
        (None, MODE_NT) => k_wrap::<S, 0, false, MODE_NT>,
        (Some(_MM_HINT_T0), MODE_XOR) => k_wrap::<S, _MM_HINT_T0, true, MODE_XOR>,
        (Some(_MM_HINT_T1), MODE_XOR) => k_wrap::<S, _MM_HINT_T1, true, MODE_XOR>,
        (Some(_MM_HINT_T2), MODE_XOR) => k_wrap::<S, _MM_HINT_T2, true, MODE_XOR>,
        (Some(_MM_HINT_NTA), MODE_XOR) => k_wrap::<S, _MM_HINT_NTA, true, MODE_XOR>,
        _ => panic!("unsupported"),
    }
}

fn kernel(s: usize, hint: Option<i32>, mode: u8) -> Kfn {
    match s {
        1 => kernel_s::<1>(hint, mode),
        2 => kernel_s::<2>(hint, mode),
        4 => kernel_s::<4>(hint, mode),
        8 => kernel_s::<8>(hint, mode),
        16 => kernel_s::<16>(hint, mode),
        _ => panic!(),
    }
}

// ---------------- variants ----------------

enum Kind {
    Copy { src: Buf, dst: Buf },
    Read { buf: Buf, k: Kfn, dist: usize, chunk: usize }, // chunk 0 = contiguous halves
}

struct Variant {
    name: String,
    kind: Kind,
}

/// One timed pass: all threads start after a barrier; time = max(end) - min(start).
fn pass(nt: usize, v: &Variant) -> f64 {
    let bar = Barrier::new(nt);
    let ts: Vec<(Instant, Instant)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..nt)
            .map(|t| {
                let bar = &bar;
                sc.spawn(move || {
                    pin(t);
                    bar.wait();
                    let st = Instant::now();
                    let per = BUF / nt;
                    match v.kind {
                        Kind::Copy { src, dst } => unsafe {
                            let s = std::slice::from_raw_parts((src.0 + t * per) as *const u8, per);
                            let d = std::slice::from_raw_parts_mut((dst.0 + t * per) as *mut u8, per);
                            d.copy_from_slice(s);
                            black_box(d.as_ptr());
                        },
                        Kind::Read { buf, k, dist, chunk } => {
                            if chunk == 0 {
                                black_box(k(black_box((buf.0 + t * per) as *const u8), per, dist));
                            } else {
                                let mut acc = 0u64;
                                let mut c = t;
                                while c * chunk < BUF {
                                    acc ^= k(black_box((buf.0 + c * chunk) as *const u8), chunk, dist);
                                    c += nt;
                                }
                                black_box(acc);
                            }
                        }
                    }
                    (st, Instant::now())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let s = ts.iter().map(|x| x.0).min().unwrap();
    let e = ts.iter().map(|x| x.1).max().unwrap();
    (e - s).as_secs_f64()
}

fn measure(nt: usize, v: &Variant) -> f64 {
    let best = (0..PASSES).map(|_| pass(nt, v)).fold(f64::INFINITY, f64::min);
    let bytes = match v.kind {
        Kind::Copy { .. } => 2 * BUF,
        _ => BUF,
    };
    bytes as f64 / best / 1e9
}

fn median(v: &mut Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let nt: usize = args.get(1).map(|s| s.parse().unwrap()).unwrap_or(2);
    let rounds: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(8);
    let filt: Vec<String> = args.get(3).map(|s| s.split(',').map(|x| x.to_string()).collect()).unwrap_or_default();

    let t0 = Instant::now();
    let src = map(BUF, true);
    let dst = map(BUF, true);
    let src4k = map(BUF, false);
    let dst4k = map(BUF, false);
    eprintln!("mapped+touched 4x512 MiB in {:.1}s; {}", t0.elapsed().as_secs_f64(), anon_huge_kib());

    let base = Variant { name: "copy_hp(baseline)".into(), kind: Kind::Copy { src, dst } };
    let mut vs: Vec<Variant> = Vec::new();
    let rd = |name: String, buf: Buf, k: Kfn, dist: usize, chunk: usize| Variant { name, kind: Kind::Read { buf, k, dist, chunk } };
    vs.push(Variant { name: "copy_4k".into(), kind: Kind::Copy { src: src4k, dst: dst4k } });
    vs.push(rd("cur4_hp".into(), src, cur_loop, 0, 0));
    vs.push(rd("cur4_4k".into(), src4k, cur_loop, 0, 0));
    for s in [1, 2, 4, 8, 16] {
        vs.push(rd(format!("avx_s{s}"), src, kernel(s, None, MODE_XOR), 0, 0));
    }
    vs.push(rd("avx_s4_4k".into(), src4k, kernel(4, None, MODE_XOR), 0, 0));
    vs.push(rd("avxaddps_s4".into(), src, kernel(4, None, MODE_ADDPS), 0, 0));
    vs.push(rd("avxaddps_s1".into(), src, kernel(1, None, MODE_ADDPS), 0, 0));
    for s in [1, 2, 4, 8, 16] {
        for (hn, h) in [("T0", _MM_HINT_T0), ("T1", _MM_HINT_T1), ("T2", _MM_HINT_T2), ("NTA", _MM_HINT_NTA)] {
            for d in [256, 512, 1024, 2048, 4096] {
                vs.push(rd(format!("pf_{hn}_d{d}_s{s}"), src, kernel(s, Some(h), MODE_XOR), d, 0));
            }
        }
    }
    vs.push(rd("il4k_s1".into(), src, kernel(1, None, MODE_XOR), 0, 4096));
    vs.push(rd("il64k_s1".into(), src, kernel(1, None, MODE_XOR), 0, 65536));
    vs.push(rd("il64k_s4".into(), src, kernel(4, None, MODE_XOR), 0, 65536));
    for s in [1, 4] {
        vs.push(rd(format!("ntload_s{s}"), src, kernel(s, None, MODE_NT), 0, 0));
    }
    if !filt.is_empty() {
        vs.retain(|v| filt.iter().any(|f| v.name.contains(f.as_str())));
    }
    eprintln!("threads={nt} rounds={rounds} variants={} passes={PASSES}", vs.len());

    // warm-up
    for _ in 0..2 {
        measure(nt, &base);
    }

    let n = vs.len();
    let mut gb = vec![Vec::<f64>::new(); n];
    let mut ratio = vec![Vec::<f64>::new(); n];
    let mut copies = Vec::<f64>::new();
    let mut rng: u64 = 0x1234_5678;
    println!("round,variant,gbps,copy_before,copy_after,ratio");
    for r in 0..rounds {
        let tr = Instant::now();
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let j = ((rng >> 33) as usize) % (i + 1);
            order.swap(i, j);
        }
        let mut cprev = measure(nt, &base);
        copies.push(cprev);
        for &i in &order {
            let g = measure(nt, &vs[i]);
            let cnext = measure(nt, &base);
            copies.push(cnext);
            let cref = (cprev * cnext).sqrt();
            gb[i].push(g);
            ratio[i].push(g / cref);
            println!("{r},{},{g:.2},{cprev:.2},{cnext:.2},{:.3}", vs[i].name, g / cref);
            cprev = cnext;
        }
        eprintln!("round {r} done in {:.1}s", tr.elapsed().as_secs_f64());
    }

    // summary
    let mut rows: Vec<(f64, f64, String, String)> = (0..n)
        .map(|i| {
            let per: Vec<String> = gb[i].iter().map(|x| format!("{x:.1}")).collect();
            (median(&mut gb[i].clone()), median(&mut ratio[i].clone()), vs[i].name.clone(), per.join(" "))
        })
        .collect();
    rows.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
    let mut c = copies.clone();
    let cm = median(&mut c);
    let cmin = copies.iter().cloned().fold(f64::INFINITY, f64::min);
    let cmax = copies.iter().cloned().fold(0.0, f64::max);
    eprintln!("\nthreads={nt}: baseline copy (2x{} MiB / t) median {cm:.2} GB/s over {} measurements (min {cmin:.1}, max {cmax:.1})", BUF / MIB, copies.len());
    eprintln!("{:<22} {:>8} {:>8}   per-round GB/s", "variant", "med GB/s", "med ratio");
    for (g, q, name, per) in rows {
        eprintln!("{name:<22} {g:>8.2} {q:>8.3}   {per}");
    }
}
