package kvevents

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Outcomes of one sync replay (syncOnce).
type syncResult uint8

const (
	syncDone   syncResult = iota // the replay answered; the index is up to date with it
	syncFailed                   // the replay did not answer (unreachable, timed out before a batch)
	syncReset                    // the engine restarted or its buffer no longer reaches us: the replica was cleared; replay again
)

var (
	errSyncRestarted = errors.New("kvevents: the engine replays another batch under the last applied number")
	errSyncBehind    = errors.New("kvevents: the engine's replay buffer starts after the last applied batch")
	errNoFurther     = errors.New("kvevents: the engine's replay buffer reaches no further back than the index's history")
)

// onConnect runs on the Run goroutine when the SUB socket (re)connected,
// before any message of that connection: it syncs the positional index
// with the engine through the replay endpoint, so batches published while
// no subscriber listened (a subscriber restart, an engine restart, a
// network blip) are not lost even when the engine then stays idle.
func (s *Subscriber) onConnect(ctx context.Context, conn uint64) {
	if s.cfg.ReplayEndpoint == "" {
		if !s.synced {
			// Nothing to check the loaded state against: re-report it as
			// it is. The first live message still reveals an engine
			// restart (its sequence went back) or a gap.
			s.synced = true
			s.finishSync(&collector{})
		}
		return
	}
	for range 2 {
		switch s.syncOnce(ctx) {
		case syncDone:
			// Batches of this connection the replay already covered are
			// late duplicates from now on, not a restart. (The connection
			// synced, not the newest: if the socket reconnected during the
			// sync, the next connection gets its own sync and its own
			// check.)
			s.seq.conn = conn
			return
		case syncFailed:
			return
		case syncReset:
			// Cleared; replay again, from the restarted engine's oldest
			// batch.
		}
	}
}

// syncOnce asks the replay endpoint for every batch the index lacks and
// applies them, collecting instead of forwarding (finishSync then sends the
// outcome and the whole index at once, which also re-reports what a
// restarted subscriber loaded from its state file):
//
//   - Without history (fresh start, no state file, or after a reset) it
//     replays from 0: the engine sends what it still buffers, from the
//     oldest batch.
//   - With history it replays from next-1, the last batch applied, to
//     recognize the engine: the same payload there means the same engine
//     (the batch is skipped, the rest applied); another payload, or no
//     batch at all (the engine's numbering is below ours), means the engine
//     restarted: the replica is cleared (syncReset). A buffer that starts
//     after next-1 cannot fill the gap: cleared too.
func (s *Subscriber) syncOnce(ctx context.Context) syncResult {
	t := &s.seq
	verify := t.started
	var from uint64
	if verify {
		from = t.next - 1 // started implies a batch was applied: next >= 1
	}
	col := &collector{}
	proc := newProcessor(s.idx, col, s.cfg.L2, s.log, s.metrics)
	n, applied := 0, 0
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	s.replaying = true
	err := Replay(rctx, s.cfg.ReplayEndpoint, from, func(seq uint64, payload []byte) error {
		sum := payloadSum(payload)
		switch {
		case n == 0 && verify:
			switch {
			case seq > from:
				return errSyncBehind
			case seq < from:
				return ErrReplayProtocol
			case sum != t.lastSum:
				return errSyncRestarted
			}
			n++
			return nil // the batch the index already reflects
		case n == 0:
			t.started, t.next, t.historyFrom = true, seq, seq // the oldest batch the engine buffers
		case seq < t.next:
			return nil
		case seq > t.next:
			return errReplayHole
		}
		n++
		applied++
		t.next, t.lastSum = seq+1, sum
		s.changes++
		if err := s.rdec.Decode(payload, &s.rbatch); err != nil {
			// A batch this replay cannot deliver: what the index holds
			// may have been removed in it. Clear and rebuild from the
			// batches after it (the collector sends ALL_CLEARED first).
			s.dropBatch(err)
			s.log.Warn("undecodable batch in the replay; clearing the replica and rebuilding from the batches after it", "seq", seq)
			proc.Reset(0)
			t.historyFrom = seq + 1
			s.extendable = false
			return nil
		}
		s.metrics.batchDecoded()
		proc.Apply(&s.rbatch)
		return nil
	})
	s.replaying = false
	cancel()

	if err != nil && ctx.Err() != nil {
		// Shutdown, not an answer from the engine: nothing is concluded
		// or forwarded. Batches applied so far changed the index without
		// their outcome being sent, so the state file is left as last
		// saved; the next start syncs from there.
		if applied > 0 {
			s.keepSaved = true
		}
		s.log.Info("shutdown during the replay sync; the next start syncs again", "from", from, "applied", applied)
		return syncFailed
	}
	switch {
	case errors.Is(err, errSyncRestarted), verify && err == nil && n == 0:
		s.metrics.replay(ReplayOK)
		s.engineRestarted("the replay does not hold the last applied batch as applied", from)
		return syncReset
	case errors.Is(err, errSyncBehind):
		s.metrics.replay(ReplayIncomplete)
		s.log.Warn("the engine's replay buffer no longer reaches the last applied batch; clearing the replica",
			"last_applied", from)
		s.proc.Reset(time.Now().UnixMicro())
		s.changes++
		s.seq = seqTracker{conn: t.conn}
		s.extendable = false
		return syncReset
	}
	s.metrics.replay(replayOutcome(err))
	if !verify && n > 0 {
		s.extendable = false // replayed from the oldest batch the engine has
	}
	answered := err == nil || n > 0
	if err != nil {
		s.log.Warn("replay sync incomplete", "from", from, "applied", applied, "err", err)
	}
	if !s.synced || applied > 0 {
		s.synced = true
		s.finishSync(col)
		s.log.Info("synced with the engine through replay", "from", from, "applied", applied,
			"next", t.next, "blocks", s.idx.Len())
	}
	if !answered {
		return syncFailed
	}
	return syncDone
}

func replayOutcome(err error) string {
	switch {
	case err == nil:
		return ReplayOK
	case errors.Is(err, errReplayHole):
		return ReplayIncomplete
	case errors.Is(err, ErrReplayTimeout):
		return ReplayTimeout
	case errors.Is(err, ErrReplayUnavailable):
		return ReplayUnavailable
	}
	return ReplayError
}

// finishSync queues the outcome of a replay collected by col, then the
// whole positional index (Forwarder.QueueSync). Run goroutine only (the
// index's writer), so the index cannot change between the read and the
// queueing.
func (s *Subscriber) finishSync(col *collector) {
	held := s.idx.AppendSnapshot(nil)
	evicted, demoted := col.result(held)
	s.fwd.QueueSync(col.cleared, evicted, demoted, held, time.Now().UnixMicro())
	s.metrics.setIndexBlocks(len(held))
}

// canRecover says whether an unknown parent may trigger recoverHistory now.
func (s *Subscriber) canRecover() bool {
	return s.cfg.ReplayEndpoint != "" && s.extendable && !s.replaying &&
		(s.lastRecovery.IsZero() || time.Since(s.lastRecovery) >= s.cfg.RecoveryInterval)
}

// recoverHistory rebuilds the positional index from the engine's oldest
// buffered batch into a private index, and adopts it when that history
// starts before the current one (so it knows more) and reaches the last
// applied batch. It is tried when a BlockStored names an
// unknown parent while the index's history began at a live message (the
// replay at connect failed or was not possible); at most once per
// RecoveryInterval, and no more once a replay from the oldest completed.
func (s *Subscriber) recoverHistory(ctx context.Context) bool {
	s.lastRecovery = time.Now()
	t := &s.seq
	tmp := NewIndex(s.cfg.BlockSize, s.cfg.MaxIndexBlocks, s.cfg.LoRAAdapters)
	col := &collector{}
	proc := newProcessor(tmp, col, s.cfg.L2, s.log, s.metrics)
	var first, last uint64
	var lastSum uint32
	n := 0
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	s.replaying = true
	err := Replay(rctx, s.cfg.ReplayEndpoint, 0, func(seq uint64, payload []byte) error {
		switch {
		case n == 0 && seq >= t.historyFrom:
			return errNoFurther // a rebuild from there knows no more than the index
		case n == 0:
			first = seq
		case seq <= last:
			return nil
		case seq != last+1:
			return errReplayHole
		}
		n++
		last, lastSum = seq, payloadSum(payload)
		if err := s.rdec.Decode(payload, &s.rbatch); err != nil {
			// As in a sync: the rebuilt history restarts after it.
			s.dropBatch(err)
			proc.Reset(0)
			first = seq + 1
			return nil
		}
		proc.Apply(&s.rbatch)
		return nil
	})
	s.replaying = false
	cancel()
	if err != nil && ctx.Err() != nil {
		return false // shutdown; the caller keeps the saved state
	}
	if err == nil && n > 0 && first >= t.historyFrom {
		err = errNoFurther // an undecodable batch restarted the rebuild at or past the index's history
	}
	switch {
	case errors.Is(err, errNoFurther):
		s.extendable = false
		s.metrics.recovery("no_further")
		s.log.Info("unknown parent: the engine's replay buffer does not reach further back than the index",
			"history_from", t.historyFrom)
		return false
	case err != nil || n == 0 || last+1 < t.next:
		s.metrics.recovery("failed")
		s.log.Warn("unknown parent: replay from the oldest batch failed", "err", err, "batches", n, "next", t.next)
		return false
	}
	s.extendable = false
	s.idx.Adopt(tmp)
	t.next, t.lastSum, t.historyFrom = last+1, lastSum, first
	s.changes++
	s.finishSync(col)
	s.metrics.recovery("adopted")
	s.log.Info("unknown parent: rebuilt the positional index from the engine's oldest batch",
		"from", first, "to", last, "blocks", s.idx.Len())
	return true
}

// loadState restores the positional index and the sequence from the state
// file. A missing, corrupt or foreign file is logged and ignored: the
// subscriber then starts without history and syncs from the engine's
// oldest buffered batch.
func (s *Subscriber) loadState() {
	if s.cfg.StateFile == "" {
		return
	}
	// A crash during a write leaves its temporary file; nothing else
	// removes it.
	removed, err := RemoveStaleStateTemps(s.cfg.StateFile)
	if len(removed) > 0 {
		s.log.Info("removed temporary state files a crash left", "files", removed)
	}
	if err != nil {
		s.log.Warn("cannot remove stale temporary state files", "err", err)
	}
	st, err := ReadStateFile(s.cfg.StateFile, s.cfg.MaxIndexBlocks)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.metrics.stateLoad("missing")
		s.log.Info("no state file yet; starting without history", "path", s.cfg.StateFile)
		return
	case errors.Is(err, ErrStateInvalid):
		s.metrics.stateLoad("invalid")
		s.log.Warn("ignoring the state file", "path", s.cfg.StateFile, "err", err)
		return
	case err != nil:
		s.metrics.stateLoad("error")
		s.log.Warn("cannot read the state file; starting without history", "path", s.cfg.StateFile, "err", err)
		return
	}
	if why := s.foreign(st); why != "" {
		s.metrics.stateLoad("foreign")
		s.log.Warn("ignoring a state file written for another replica or configuration", "path", s.cfg.StateFile, "differs", why)
		return
	}
	n := s.idx.Restore(st.Entries)
	if st.Started {
		s.seq = seqTracker{started: true, next: st.Next, lastSum: st.LastSum, historyFrom: st.HistoryFrom}
		s.next.Store(st.Next)
		s.extendable = st.HistoryFrom > 0
	}
	s.metrics.setIndexBlocks(n)
	s.metrics.stateLoad("ok")
	s.log.Info("state file loaded", "path", s.cfg.StateFile, "blocks", n, "next", st.Next,
		"saved_at", st.SavedAt, "age", time.Since(st.SavedAt).Round(time.Millisecond))
}

// foreign names the first identity field of st that differs from the
// configuration, "" when none does.
func (s *Subscriber) foreign(st *State) string {
	switch {
	case st.ReplicaID != s.cfg.ReplicaID:
		return "replica id"
	case st.TenantID != s.cfg.TenantID:
		return "tenant id"
	case st.ModelID != s.cfg.ModelID:
		return "model id"
	case st.HashScheme != s.cfg.HashScheme:
		return "hash scheme"
	case st.BlockSize != s.cfg.BlockSize:
		return "block size"
	}
	return ""
}

// encodeState returns the encoded state when it changed since the last
// save (or force), else nil. Run goroutine only: the index and seq are
// consistent between two messages.
func (s *Subscriber) encodeState(force bool) []byte {
	if s.changes == s.saved && !force {
		return nil
	}
	t := &s.seq
	st := &State{
		ReplicaID: s.cfg.ReplicaID, TenantID: s.cfg.TenantID, ModelID: s.cfg.ModelID, HashScheme: s.cfg.HashScheme,
		BlockSize: s.cfg.BlockSize,
		Started:   t.started, Next: t.next, LastSum: t.lastSum, HistoryFrom: t.historyFrom,
		SavedAt: time.Now(),
		Entries: s.idx.AppendState(nil),
	}
	data, err := st.AppendBinary(nil)
	if err != nil {
		s.metrics.stateSave("error")
		s.log.Warn("cannot encode the state", "err", err)
		return nil
	}
	return data
}

// stateWriter writes state files off the Run goroutine (a write syncs the
// file and its directory).
type stateWriter struct {
	path    string
	log     *slog.Logger
	metrics *Metrics
	ch      chan []byte   // at most one write waiting
	done    chan struct{} // closed when run returned
	once    sync.Once     // guards close(ch)
	// failed is set by a failed write and cleared by a good one (writer
	// goroutine); the Run goroutine reads it to retry without a change.
	failed atomic.Bool
}

func newStateWriter(path string, log *slog.Logger, m *Metrics) *stateWriter {
	return &stateWriter{path: path, log: log, metrics: m, ch: make(chan []byte, 1), done: make(chan struct{})}
}

func (w *stateWriter) run() {
	defer close(w.done)
	for data := range w.ch {
		w.write(data)
	}
}

// offer hands data to the writer goroutine; false when a write is still
// waiting (the caller tries again at its next tick).
func (w *stateWriter) offer(data []byte) bool {
	select {
	case w.ch <- data:
		return true
	default:
		return false
	}
}

// close stops the writer goroutine after the write in progress or waiting.
func (w *stateWriter) close() {
	w.once.Do(func() { close(w.ch) })
	<-w.done
}

func (w *stateWriter) write(data []byte) {
	if err := WriteStateFile(w.path, data); err != nil {
		w.failed.Store(true)
		w.metrics.stateSave("error")
		w.log.Warn("cannot write the state file", "path", w.path, "err", err)
		return
	}
	w.failed.Store(false)
	w.metrics.stateSave("ok")
}
