package endpoints

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// ErrAlreadyRunning is returned by a second call of a source's Run.
var ErrAlreadyRunning = errors.New("endpoints: Run called twice")

// Reload timing of the file source. An event starts a settle period that
// each further event restarts, so a burst (an editor's truncate-then-write,
// a ConfigMap swap's five steps) is read once, when it is over; maxSettle
// caps the wait in a directory that never goes quiet.
const (
	settle    = 100 * time.Millisecond
	maxSettle = time.Second
)

// File is a Source that reads a static endpoints file (YAML or JSON; see
// the package doc) and keeps it current: it watches the file's directory
// with fsnotify (so an atomic rename over the file and a Kubernetes
// ConfigMap's ..data symlink swap are seen, not only writes in place) and
// re-reads the file every resync interval as a fallback. An unchanged file
// (same SHA-256) publishes nothing; a bad edit keeps the last good pool,
// logs why (rate-limited) and is reported to the Observer once per distinct
// bad content. File is safe for concurrent use.
type File struct {
	path string
	dir  string
	o    options
	log  limitedLog

	// pool is the last good pool: stored by NewFile and then by the Run
	// goroutine only, loaded by Pool from any goroutine.
	pool atomic.Pointer[Pool]
	// running is set by the first call of Run.
	running atomic.Bool
	// reads counts the times the file was read (NewFile's read included),
	// changed or not: tests wait on it to know a reload happened.
	reads atomic.Int64

	// lastKey is the SHA-256 of the last input tried: the file's bytes, or
	// the read error's text. An input equal to it is neither decoded nor
	// counted again. failing says that input was bad. Both are written by
	// NewFile and then by the Run goroutine only.
	lastKey [sha256.Size]byte
	failing bool
}

// NewFile reads and validates the endpoints file at path. The file must be
// valid: an error here (naming the file and the field at fault) should stop
// the server from starting. Run keeps the pool current after that. Options:
// WithObserver, WithLogger, WithResyncInterval.
func NewFile(path string, opts ...Option) (*File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("cannot resolve endpoints file path %q: %w", path, err)
	}
	f := &File{path: abs, dir: filepath.Dir(abs), o: makeOptions(opts)}
	f.log.log = f.o.log
	p, key, _, err := f.load()
	if err != nil {
		return nil, err
	}
	f.lastKey = key
	f.pool.Store(p)
	f.o.observer.PoolChanged(p.Len())
	f.o.log.Info("endpoints file loaded", "path", f.path, "tenant", p.Tenant, "endpoints", p.Len())
	return f, nil
}

// Path is the absolute path of the file.
func (f *File) Path() string { return f.path }

// Pool implements Source: the last good pool, never nil.
func (f *File) Pool() *Pool { return f.pool.Load() }

// Synced implements Source: the file was read by NewFile.
func (f *File) Synced() <-chan struct{} { return closed }

// Run implements Source: it watches and re-reads the file until ctx ends,
// then returns nil. If the directory cannot be watched (inotify limits),
// it logs why and relies on the periodic re-read.
func (f *File) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if !f.o.noWatch {
		w, err := f.watch()
		if err != nil {
			f.o.log.Warn("cannot watch the endpoints file's directory; re-reading the file every resync interval only",
				"path", f.path, "resync", f.o.resync, "error", err)
		} else {
			defer w.Close()
			events, watchErrs = w.Events, w.Errors
		}
	}
	var resync <-chan time.Time
	if f.o.resync > 0 {
		t := time.NewTicker(f.o.resync)
		defer t.Stop()
		resync = t.C
	}
	// Whatever changed between NewFile and the watch.
	f.reload()

	settled := time.NewTimer(time.Hour)
	settled.Stop()
	defer settled.Stop()
	var burstStart time.Time // zero: no event waiting for its settle period
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Op == fsnotify.Chmod {
				continue // attributes only: the content did not change
			}
			now := time.Now()
			if burstStart.IsZero() {
				burstStart = now
			}
			settled.Reset(max(0, min(settle, maxSettle-now.Sub(burstStart))))
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			f.log.warn("endpoints file watch error; the periodic re-read still runs", "path", f.path, "error", err)
		case <-settled.C:
			burstStart = time.Time{}
			f.reload()
		case <-resync:
			f.reload()
		}
	}
}

// watch watches the file's directory: the file itself would lose its watch
// when it is replaced by a rename, and a ConfigMap mount changes the file
// by renaming the ..data symlink next to it.
func (f *File) watch() (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(f.dir); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// reload re-reads the file and publishes its pool if the content changed
// and is valid. Run goroutine only.
func (f *File) reload() {
	p, key, reason, err := f.load()
	if key == f.lastKey {
		return
	}
	f.lastKey = key
	if err != nil {
		f.failing = true
		f.o.observer.ReloadFailed(reason)
		f.log.warn("endpoints file not reloaded; keeping the last good pool", "path", f.path, "reason", reason, "error", err)
		return
	}
	if f.failing {
		f.failing = false
		f.o.log.Info("endpoints file is valid again", "path", f.path)
	}
	if f.pool.Load().Equal(p) {
		return
	}
	f.pool.Store(p)
	f.o.observer.PoolChanged(p.Len())
	f.o.log.Info("endpoints file reloaded", "path", f.path, "tenant", p.Tenant, "endpoints", p.Len())
}

// load reads and decodes the file. key identifies the input (the content,
// or the read error); reason is the Observer reason of a failure.
func (f *File) load() (p *Pool, key [sha256.Size]byte, reason string, err error) {
	f.reads.Add(1)
	data, err := readBounded(f.path)
	if err != nil {
		err = fmt.Errorf("cannot read endpoints file %q: %w", f.path, err)
		return nil, sha256.Sum256([]byte("\x00read error\x00" + err.Error())), ReasonRead, err
	}
	key = sha256.Sum256(data)
	p, reason, err = decodeFile(data)
	if err != nil {
		return nil, key, reason, fmt.Errorf("endpoints file %q: %w", f.path, err)
	}
	return p, key, "", nil
}

// readBounded reads a file of at most MaxFileBytes.
func readBounded(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileBytes)
	}
	return data, nil
}
