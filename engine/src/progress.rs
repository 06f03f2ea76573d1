//! Progress of loading a model's weights: which file (shard) is being read,
//! bytes done of how many, tensors, elapsed time, and a final total with the
//! device the weights went to.
//!
//! The loaders (`read_weights` for safetensors shards, `gguf::model::weights`
//! for GGUF tensors) drive a [`Load`]; it hands [`LoadEvent`]s to a
//! [`LoadProgress`] reporter. Two reporters come with the engine:
//! [`LogLines`] (one log line per file and a total, through `tracing`, so
//! they follow the log format: plain text, or JSON) and [`TerminalBar`] (a
//! bar redrawn in place on stderr, for a terminal). The binary picks one and
//! sets it in `EngineOptions::load_progress`; without one, loads log lines.

use std::fmt;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tch::Device;

/// One file (shard) of a load.
#[derive(Debug, Clone, Copy)]
pub struct FileState<'a> {
    /// The file's path.
    pub path: &'a Path,
    /// 1-based position among the load's files, and how many there are.
    pub index: usize,
    pub files: usize,
    /// The file's size, and how much of it is read.
    pub bytes: u64,
    pub done: u64,
    /// Tensors read from it so far.
    pub tensors: usize,
    /// Time since this file started.
    pub elapsed: Duration,
}

/// The whole load so far.
#[derive(Debug, Clone, Copy)]
pub struct Totals {
    /// Bytes of every file of the load, and how many are read.
    pub bytes: u64,
    pub done: u64,
    pub tensors: usize,
    /// Time since the load started.
    pub elapsed: Duration,
}

/// What a reporter hears, in order: per file some `Advanced` then one
/// `FileDone`; at the end one `Finished`.
#[derive(Debug, Clone, Copy)]
pub enum LoadEvent<'a> {
    /// More of a file is read.
    Advanced { file: FileState<'a>, total: Totals },
    /// A file is read whole.
    FileDone { file: FileState<'a>, total: Totals },
    /// The weights are on `device` ("cpu", "cuda:0").
    Finished { total: Totals, device: &'a str },
}

/// Something that shows load progress. Called on the loading thread.
pub trait LoadProgress: Send + Sync + fmt::Debug {
    fn report(&self, event: &LoadEvent<'_>);
}

/// Human-readable bytes: `512 B`, `1.5 KiB`, `270.3 MiB`, `4.00 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let digits = if unit >= 2 { 2 } else { 1 };
    format!("{v:.digits$} {}", UNITS[unit])
}

/// One log line per file and one total, through `tracing` (so plain text,
/// or JSON with `--log-format json`, and never terminal codes of its own).
#[derive(Debug, Default)]
pub struct LogLines;

impl LoadProgress for LogLines {
    fn report(&self, event: &LoadEvent<'_>) {
        match *event {
            LoadEvent::Advanced { .. } => {}
            LoadEvent::FileDone { file, .. } => tracing::info!(
                file = %file.path.display(),
                shard = format!("{}/{}", file.index, file.files),
                bytes = file.bytes,
                size = human_bytes(file.bytes),
                tensors = file.tensors,
                secs = format!("{:.2}", file.elapsed.as_secs_f64()),
                "weights file loaded"
            ),
            LoadEvent::Finished { total, device } => tracing::info!(
                bytes = total.bytes,
                size = human_bytes(total.bytes),
                tensors = total.tensors,
                secs = format!("{:.2}", total.elapsed.as_secs_f64()),
                device,
                "weights loaded"
            ),
        }
    }
}

/// A progress bar on stderr, redrawn in place (`\r`, erase line) at most
/// every 100 ms, with a line kept per finished file; the total goes to the
/// log like [`LogLines`]'s. For a terminal only.
#[derive(Debug, Default)]
pub struct TerminalBar {
    last_draw: Mutex<Option<Instant>>,
}

/// Width of the bar, in cells.
const BAR: usize = 30;

impl TerminalBar {
    pub fn new() -> Self {
        Self::default()
    }

    /// The bar line (without the leading redraw codes).
    pub fn line(file: &FileState<'_>, total: &Totals) -> String {
        let frac = if total.bytes == 0 {
            1.0
        } else {
            (total.done as f64 / total.bytes as f64).min(1.0)
        };
        let filled = (frac * BAR as f64).round() as usize;
        let name = file.path.file_name().map_or_else(
            || file.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        format!(
            "loading weights [{}{}] {:>3}% {} / {}  {:.1}s  ({}/{}) {name}",
            "#".repeat(filled),
            "-".repeat(BAR - filled),
            (frac * 100.0).round() as u32,
            human_bytes(total.done),
            human_bytes(total.bytes),
            total.elapsed.as_secs_f64(),
            file.index,
            file.files,
        )
    }

    fn draw(&self, text: &str, keep: bool) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}");
        if keep {
            let _ = writeln!(err);
        }
        let _ = err.flush();
    }
}

impl LoadProgress for TerminalBar {
    fn report(&self, event: &LoadEvent<'_>) {
        let now = Instant::now();
        let mut last = self.last_draw.lock().unwrap_or_else(|e| e.into_inner());
        match *event {
            LoadEvent::Advanced { file, total } => {
                let due = last.is_none_or(|t| now.duration_since(t) >= Duration::from_millis(100));
                if due || file.done == file.bytes {
                    self.draw(&Self::line(&file, &total), false);
                    *last = Some(now);
                }
            }
            LoadEvent::FileDone { file, total } => {
                self.draw(&Self::line(&file, &total), false);
                self.draw(
                    &format!(
                        "loaded ({}/{}) {}: {}, {} tensors, {:.2}s",
                        file.index,
                        file.files,
                        file.path.display(),
                        human_bytes(file.bytes),
                        file.tensors,
                        file.elapsed.as_secs_f64()
                    ),
                    true,
                );
                *last = Some(now);
            }
            LoadEvent::Finished { .. } => {
                drop(last);
                LogLines.report(event);
            }
        }
    }
}

/// The reporter loads use (see `EngineOptions::load_progress`).
static REPORTER: RwLock<Option<Arc<dyn LoadProgress>>> = RwLock::new(None);

/// Makes `reporter` the one every later load in this process reports to.
pub fn set_reporter(reporter: Arc<dyn LoadProgress>) {
    *REPORTER.write().unwrap_or_else(|e| e.into_inner()) = Some(reporter);
}

fn reporter() -> Arc<dyn LoadProgress> {
    REPORTER
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| Arc::new(LogLines))
}

/// "cpu" or "cuda:N".
pub fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        Device::Mps => "mps".into(),
        Device::Vulkan => "vulkan".into(),
        Device::Cpu => "cpu".into(),
    }
}

/// One load in progress: the loaders call `plan` with the files' sizes,
/// then per file `start_file`, `advance` and `finish_file`, and the model
/// `finish` once its weights are on the device.
pub(crate) struct Load {
    reporter: Arc<dyn LoadProgress>,
    started: Instant,
    bytes: u64,
    done: u64,
    tensors: usize,
    files: usize,
    file: Option<OpenFile>,
}

struct OpenFile {
    path: std::path::PathBuf,
    index: usize,
    bytes: u64,
    done: u64,
    tensors: usize,
    started: Instant,
}

impl Load {
    pub(crate) fn begin() -> Self {
        Self {
            reporter: reporter(),
            started: Instant::now(),
            bytes: 0,
            done: 0,
            tensors: 0,
            files: 0,
            file: None,
        }
    }

    /// The load reads `files` files of `bytes` bytes in all.
    pub(crate) fn plan(&mut self, files: usize, bytes: u64) {
        self.files += files;
        self.bytes += bytes;
    }

    pub(crate) fn start_file(&mut self, path: &Path, index: usize, bytes: u64) {
        self.file = Some(OpenFile {
            path: path.to_path_buf(),
            index,
            bytes,
            done: 0,
            tensors: 0,
            started: Instant::now(),
        });
    }

    fn states<'a>(&self, f: &'a OpenFile) -> (FileState<'a>, Totals) {
        let file = FileState {
            path: &f.path,
            index: f.index,
            files: self.files,
            bytes: f.bytes,
            done: f.done,
            tensors: f.tensors,
            elapsed: f.started.elapsed(),
        };
        (file, self.totals())
    }

    fn totals(&self) -> Totals {
        Totals {
            bytes: self.bytes,
            done: self.done,
            tensors: self.tensors,
            elapsed: self.started.elapsed(),
        }
    }

    /// `bytes` more of the current file are read, holding `tensors` tensors.
    pub(crate) fn advance(&mut self, bytes: u64, tensors: usize) {
        let Some(mut f) = self.file.take() else {
            return;
        };
        let bytes = bytes.min(f.bytes - f.done);
        f.done += bytes;
        f.tensors += tensors;
        self.done += bytes;
        self.tensors += tensors;
        let (file, total) = self.states(&f);
        self.reporter.report(&LoadEvent::Advanced { file, total });
        self.file = Some(f);
    }

    /// The current file is read whole (its headers counted as read too).
    pub(crate) fn finish_file(&mut self) {
        let Some(mut f) = self.file.take() else {
            return;
        };
        self.done += f.bytes - f.done;
        f.done = f.bytes;
        let (file, total) = self.states(&f);
        self.reporter.report(&LoadEvent::FileDone { file, total });
    }

    /// The weights are on `device`: reports the total.
    pub(crate) fn finish(&self, device: Device) {
        let name = device_name(device);
        self.reporter.report(&LoadEvent::Finished {
            total: self.totals(),
            device: &name,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Record(Mutex<Vec<String>>);

    impl LoadProgress for Record {
        fn report(&self, e: &LoadEvent<'_>) {
            let line = match e {
                LoadEvent::Advanced { file, total } => {
                    format!(
                        "adv {} {}/{} {}/{}",
                        file.index, file.done, file.bytes, total.done, total.bytes
                    )
                }
                LoadEvent::FileDone { file, total } => format!(
                    "done {} {} {} {}/{} {}",
                    file.index, file.bytes, file.tensors, total.done, total.bytes, total.tensors
                ),
                LoadEvent::Finished { total, device } => {
                    format!("total {} {} {device}", total.bytes, total.tensors)
                }
            };
            self.0.lock().expect("lock").push(line);
        }
    }

    #[test]
    fn a_load_reports_each_file_and_the_total() {
        let rec = Arc::new(Record::default());
        let mut load = Load::begin();
        load.reporter = rec.clone();
        load.plan(2, 300);
        load.start_file(Path::new("a.safetensors"), 1, 100);
        load.advance(90, 3);
        load.finish_file();
        load.start_file(Path::new("b.safetensors"), 2, 200);
        load.advance(150, 1);
        load.advance(100, 1); // clamped to the file's size
        load.finish_file();
        load.finish(Device::Cpu);
        let got = rec.0.lock().expect("lock").clone();
        assert_eq!(
            got,
            [
                "adv 1 90/100 90/300",
                "done 1 100 3 100/300 3",
                "adv 2 150/200 250/300",
                "adv 2 200/200 300/300",
                "done 2 200 2 300/300 5",
                "total 300 5 cpu",
            ]
        );
    }

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(270 << 20), "270.0 MiB");
        assert_eq!(human_bytes(4 << 30), "4.00 GiB");
    }

    #[test]
    fn the_bar_shows_bytes_time_and_file() {
        let file = FileState {
            path: Path::new("/m/model-00001-of-00002.safetensors"),
            index: 1,
            files: 2,
            bytes: 100,
            done: 50,
            tensors: 1,
            elapsed: Duration::from_millis(1500),
        };
        let total = Totals {
            bytes: 2048,
            done: 1024,
            tensors: 1,
            elapsed: Duration::from_millis(2500),
        };
        let line = TerminalBar::line(&file, &total);
        assert!(
            line.contains(&format!("[{}{}]", "#".repeat(15), "-".repeat(15))),
            "{line}"
        );
        assert!(
            line.contains(" 50% 1.0 KiB / 2.0 KiB  2.5s  (1/2) model-00001-of-00002.safetensors"),
            "{line}"
        );
    }
}
