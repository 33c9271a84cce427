package loadgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/lookupclient"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Timeouts of the phases around the measured run.
const (
	// populateTimeout bounds the populate phase, barrier included.
	populateTimeout = 2 * time.Minute
	// closeTimeout bounds the final half-close of the report streams.
	closeTimeout = 10 * time.Second
	// jobQueue is the open-loop queue between the scheduler and the
	// workers; when it is full the scheduler waits (and the wait is charged
	// to the requests' latency).
	jobQueue = 4096
	// timerSlack is how early the open-loop scheduler may release a
	// request. Go timers wake up to about a millisecond late for short
	// sleeps (measured on Linux VMs), which would charge the client's
	// timer to the server; releasing requests up to timerSlack early and
	// timing an early request from its actual send keeps the charge out,
	// at the cost of up to 1 ms of jitter in the arrival process.
	timerSlack = time.Millisecond
)

// recorder holds one worker's results.
type recorder struct {
	// mu guards every field below: the owning worker writes them after each
	// lookup; the progress loop and the final merge read (and the progress
	// loop resets the interval fields) under it.
	mu sync.Mutex

	latency Histogram // measured window: client-observed latency
	server  Histogram // measured window: the response's lookup_latency_us
	lag     Histogram // measured window: actual send minus intended send
	ok      int64     // measured window: responses
	hints   int64     // measured window: responses with replica scores
	reasons map[string]int64
	errs    map[string]int64 // measured window: failed calls by gRPC code

	allReasons map[string]int64 // every response, warm-up included
	allErrs    int64            // every failed call, warm-up included
	warmup     int64            // warm-up responses and errors

	interval     Histogram // since the last progress line, any phase
	intervalErrs int64
}

func newRecorder() *recorder {
	return &recorder{reasons: map[string]int64{}, errs: map[string]int64{}, allReasons: map[string]int64{}}
}

// job is one open-loop request: its stream index and intended send time.
type job struct {
	i        uint64
	intended time.Time
	measured bool
}

// runner is one Run in progress.
type runner struct {
	cfg    *Config
	src    *source
	client pb.InferenceCacheClient
	// lookup is the lookup call: the unary LookupRoute, or with
	// LookupStream a lookupclient's, on the workers' streams.
	lookup  func(context.Context, *pb.LookupRouteRequest, ...grpc.CallOption) (*pb.LookupRouteResponse, error)
	cluster *cluster
	first   uint64 // stream index of the first lookup (after populate)

	recs []*recorder
	// tl is the run's timeline, shared by the workers (atomic counters).
	tl *timeline

	// unfinished counts requests of the run without an answer when the
	// drain deadline passed (never sent, or cut off in flight); written by
	// the scheduler and the workers.
	unfinished atomic.Int64
	// started is when lookups began; written before any worker starts.
	started time.Time
}

// Run populates the server, runs the lookups with the feedback loop for
// Warmup+Duration, and returns the report. Every phase is bounded: the run
// takes at most about Warmup + Duration + DrainTimeout plus the populate
// and close timeouts. ctx cancels the run early (the report then covers
// what ran).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	wc := cfg.Workload
	if wc.Size == 0 && wc.Kind != WorkloadTrace {
		wc.Size = defaultSize(&cfg)
	}
	src, err := newSource(wc, cfg.Seed)
	if err != nil {
		return nil, err
	}
	conn := cfg.Conn
	if conn == nil {
		creds := insecure.NewCredentials()
		if cfg.TLS != nil {
			creds = credentials.NewTLS(cfg.TLS)
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
		if cfg.LookupStream {
			// Fixed windows turn off the BDP estimator, which would ping
			// after every streamed answer (docs/wire.md).
			opts = append(opts, grpc.WithInitialWindowSize(streamClientWindow), grpc.WithInitialConnWindowSize(streamClientWindow))
		}
		cc, err := grpc.NewClient(cfg.Target, opts...)
		if err != nil {
			return nil, fmt.Errorf("cannot dial %s: %w", cfg.Target, err)
		}
		defer cc.Close()
		conn = cc
	}
	r := &runner{cfg: &cfg, src: src, client: pb.NewInferenceCacheClient(conn)}
	r.lookup = r.client.LookupRoute
	if cfg.LookupStream {
		// One stream per worker: a worker has one lookup in flight, so no
		// call falls back to a unary call.
		lc := lookupclient.New(conn, lookupclient.Options{Streams: cfg.Concurrency})
		defer lc.Close()
		r.lookup = lc.LookupRoute
	}
	r.cluster = newCluster(r.cfg, r.client, src)
	return r.run(ctx)
}

// streamClientWindow is the fixed HTTP/2 flow-control window, per stream
// and per connection, of a connection dialed for LookupStream.
const streamClientWindow = 1 << 20

// defaultSize is the epoch size of a generated workload when none is set:
// the populate requests plus what an open-loop run at a fixed rate sends
// (so its lookups never wrap), within [MinWorkloadSize, MaxWorkloadSize];
// MaxWorkloadSize otherwise.
func defaultSize(cfg *Config) int {
	if cfg.Mode != OpenLoop || cfg.Arrival == ArrivalTrace {
		return MaxWorkloadSize
	}
	want := cfg.Rate * (cfg.Warmup + cfg.Duration).Seconds() * 1.05
	if cfg.PopulateRequests >= 0 {
		want += float64(cfg.PopulateRequests)
	} else {
		// Lookups start after the default populate, which takes up to a
		// quarter of the epoch.
		want *= 4.0 / 3
	}
	return int(min(max(want, MinWorkloadSize), MaxWorkloadSize))
}

// defaultPopulate is the populate size when none is set: a quarter of the
// epoch, but no more requests than fill the replicas' caches once.
func defaultPopulate(cfg *Config, src *source) int {
	fill := float64(cfg.Replicas) * float64(cfg.ReplicaCacheBlocks) / max(src.meanBlocks, 1)
	return int(min(float64(len(src.reqs)/4), fill))
}

func (r *runner) run(ctx context.Context) (*Report, error) {
	cfg, c := r.cfg, r.cluster
	rep := newReport(cfg, r.src)

	// The eviction senders run through populate and the lookups.
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBg()
	var bg sync.WaitGroup
	for _, rp := range c.replicas {
		bg.Go(func() { rp.evictLoop(bgCtx) })
	}

	// Populate, then a barrier: closing the streams waits for the server to
	// apply everything.
	popN := cfg.PopulateRequests
	if popN < 0 {
		popN = defaultPopulate(cfg, r.src)
	}
	popN = min(popN, len(r.src.reqs))
	pctx, cancel := context.WithTimeout(ctx, populateTimeout)
	c.streamCtx = pctx // a stream that breaks during populate reopens under it
	t0 := time.Now()
	err := c.openStreams(pctx)
	if err == nil {
		rep.Populate.Blocks = c.populate(pctx, popN, 64)
		err = c.closeStreams(pctx)
	}
	cancel()
	if err != nil {
		stopBg()
		bg.Wait()
		return nil, fmt.Errorf("cannot populate the server: %w", err)
	}
	rep.Populate.Requests = popN
	rep.Populate.Messages = c.reports.Load()
	rep.Populate.Seconds = time.Since(t0).Seconds()
	if rep.Populate.Seconds > 0 {
		rep.Populate.BlocksPerSec = float64(rep.Populate.Blocks) / rep.Populate.Seconds
	}
	r.first = uint64(popN)

	streamCtx, stopStreams := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStreams()
	c.streamCtx = streamCtx
	if err := c.openStreams(streamCtx); err != nil {
		stopBg()
		bg.Wait()
		return nil, err
	}
	for _, rp := range c.replicas {
		bg.Go(func() { rp.loop(bgCtx) })
	}
	if cfg.ClearEvery > 0 {
		bg.Go(func() { r.clearLoop(bgCtx) })
	}

	r.recs = make([]*recorder, cfg.Concurrency)
	for i := range r.recs {
		r.recs[i] = newRecorder()
	}
	r.tl = newTimeline(cfg.Warmup + cfg.Duration)
	r.started = time.Now()
	end := r.started.Add(cfg.Warmup + cfg.Duration)
	drainBy := end.Add(cfg.DrainTimeout)
	runCtx, stopRun := context.WithDeadline(ctx, drainBy)
	defer stopRun()

	progCtx, stopProg := context.WithCancel(runCtx)
	var prog sync.WaitGroup
	if cfg.Progress != nil {
		prog.Go(func() { r.progressLoop(progCtx) })
	}
	var window sync.WaitGroup
	if cfg.OnWindow != nil {
		window.Go(func() { r.windowCalls(runCtx, end) })
	}
	if cfg.Mode == ClosedLoop {
		r.closedLoop(runCtx, end)
	} else {
		r.openLoop(runCtx, end, drainBy)
	}
	elapsed := time.Since(r.started)
	window.Wait()
	stopProg()
	prog.Wait()

	// Stop the replicas (they flushed what fell due while the lookups
	// drained) and the eviction senders, then close the streams.
	stopBg()
	bg.Wait()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	closeErr := c.closeStreams(cctx)
	cancel()

	r.fill(rep, elapsed)
	if closeErr != nil {
		rep.Feedback.ReportErrors++
		rep.Feedback.LastError = closeErr.Error()
	}
	return rep, nil
}

// windowCalls calls OnWindow(true) when the warm-up ends and
// OnWindow(false) at end, unless ctx ends first.
func (r *runner) windowCalls(ctx context.Context, end time.Time) {
	for _, at := range []struct {
		t    time.Time
		open bool
	}{{r.started.Add(r.cfg.Warmup), true}, {end, false}} {
		t := time.NewTimer(time.Until(at.t))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		r.cfg.OnWindow(at.open)
	}
}

// clearLoop asks one replica after another to clear its cache.
func (r *runner) clearLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.ClearEvery)
	defer t.Stop()
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.cluster.replicas[k%len(r.cluster.replicas)].clearReq.Store(true)
		}
	}
}

// openLoop schedules requests at their intended times until end and lets
// Concurrency workers send them; requests without an answer at drainBy
// count as unfinished.
func (r *runner) openLoop(ctx context.Context, end, drainBy time.Time) {
	cfg := r.cfg
	var sched *Schedule
	if cfg.Arrival == ArrivalTrace {
		first, speed := r.first, cfg.Speedup
		sched = newTraceSchedule(func(i uint64) time.Duration {
			return time.Duration(float64(r.src.arrival(first+i, first)) / speed)
		})
	} else {
		var err error
		sched, err = NewSchedule(cfg.Arrival, cfg.Rate, cfg.Seed)
		if err != nil {
			panic("BUG: validated config gives no schedule: " + err.Error())
		}
	}
	jobs := make(chan job, jobQueue)
	var wg sync.WaitGroup
	for w := range r.recs {
		wg.Go(func() { r.openWorker(ctx, r.recs[w], jobs, drainBy) })
	}
	window := end.Sub(r.started)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// dispatch sends request i at its intended time; false means ctx ended
	// first and the request was not sent.
	dispatch := func(i uint64, off time.Duration) bool {
		due := r.started.Add(off)
		if wait := time.Until(due) - timerSlack; wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return false
			}
		}
		if ctx.Err() != nil {
			return false
		}
		select {
		case jobs <- job{i: i, intended: due, measured: off >= cfg.Warmup}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	var i uint64
	for off := sched.Next(); off < window; off = sched.Next() {
		if !dispatch(i, off) {
			// Count this request and the rest of the window as never
			// sent. The schedule is finite before the window closes, and
			// cheap to walk.
			r.unfinished.Add(1)
			for off = sched.Next(); off < window; off = sched.Next() {
				r.unfinished.Add(1)
			}
			break
		}
		i++
	}
	close(jobs)
	wg.Wait()
}

func (r *runner) openWorker(ctx context.Context, rec *recorder, jobs <-chan job, drainBy time.Time) {
	var w worker
	for j := range jobs {
		if ctx.Err() != nil || time.Now().After(drainBy) {
			r.unfinished.Add(1)
			continue
		}
		w.lookup(ctx, r, rec, r.first+j.i, j.intended, j.measured)
	}
}

// closedLoop runs Concurrency workers back to back until end.
func (r *runner) closedLoop(ctx context.Context, end time.Time) {
	var next atomic.Uint64 // the stream index the next lookup takes; shared by the workers
	measureFrom := r.started.Add(r.cfg.Warmup)
	var wg sync.WaitGroup
	for w := range r.recs {
		wg.Go(func() {
			var wk worker
			for ctx.Err() == nil {
				now := time.Now()
				if !now.Before(end) {
					return
				}
				i := next.Add(1) - 1
				wk.lookup(ctx, r, r.recs[w], r.first+i, now, !now.Before(measureFrom))
			}
		})
	}
	wg.Wait()
}

// worker is one sender's reusable request state.
type worker struct {
	buf chainBuf
	req pb.LookupRouteRequest
}

// lookup sends stream request i, records the outcome, and feeds the
// routing decision to the replicas. Latency runs from the intended send
// time, or from the actual send when the request left early (open loop,
// within timerSlack): a request held back by busy workers or a stalled
// scheduler is charged for the wait.
func (w *worker) lookup(ctx context.Context, r *runner, rec *recorder, i uint64, intended time.Time, measured bool) {
	cfg := r.cfg
	wreq, epoch := r.src.at(i)
	hashes, counts, keys := w.buf.build(r.src, wreq, epoch)
	w.req.TenantId, w.req.ModelId, w.req.HashScheme = cfg.TenantID, cfg.ModelID, cfg.HashScheme
	w.req.BlockHashes, w.req.BlockTokenCounts = hashes, counts

	sent := time.Now()
	cctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	resp, err := r.lookup(cctx, &w.req)
	cancel()
	done := time.Now()
	lat := done.Sub(intended)
	if sent.Before(intended) {
		lat = done.Sub(sent)
	}

	hits := 0
	if err == nil {
		hits = r.cluster.route(resp, wreq, epoch, keys, done)
	} else if ctx.Err() != nil {
		// Cut off by the end of the run, not failed: the server may or may
		// not have answered it.
		r.unfinished.Add(1)
		return
	}
	slot := r.tl.index(intended.Sub(r.started))
	if err != nil {
		r.tl.recordErr(slot)
	} else {
		r.tl.recordOK(slot, lat, time.Duration(resp.GetLookupLatencyUs())*time.Microsecond, resp.GetReasonCode(), hits, len(keys))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.interval.Record(lat)
	if err != nil {
		rec.allErrs++
		rec.intervalErrs++
		if measured {
			rec.errs[status.Code(err).String()]++
		} else {
			rec.warmup++
		}
		return
	}
	reason := resp.GetReasonCode()
	rec.allReasons[reason]++
	if !measured {
		rec.warmup++
		return
	}
	rec.ok++
	rec.reasons[reason]++
	if len(resp.GetReplicaScores()) > 0 {
		rec.hints++
	}
	rec.latency.Record(lat)
	rec.lag.Record(sent.Sub(intended))
	rec.server.Record(time.Duration(resp.GetLookupLatencyUs()) * time.Microsecond)
}
