package certs

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// DefaultResync is how often Keeper runs Ensure without an event, to renew
// certificates ahead of expiry.
const DefaultResync = time.Hour

// retryAfter is the delay before a failed Ensure is retried.
const retryAfter = 5 * time.Second

// Keeper runs Ensure on every replica (it does not need leadership) whenever
// the CA Secret or one of the two webhook configurations changes, and every
// Resync. It watches exactly those objects by name (a field selector on
// metadata.name), so RBAC can grant list and watch on them by resourceName.
type Keeper struct {
	// Config reaches the apiserver for the watches.
	Config *rest.Config
	// Scheme knows core/v1 and admissionregistration/v1.
	Scheme *runtime.Scheme
	// Client reads and writes live (no cache): Ensure must see the Secret
	// another replica just wrote.
	Client  client.Client
	Options Options
	// Resync defaults to DefaultResync.
	Resync time.Duration
	Log    logr.Logger
}

var (
	_ manager.Runnable               = (*Keeper)(nil)
	_ manager.LeaderElectionRunnable = (*Keeper)(nil)
)

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica serves webhooks, so every replica keeps its certificate.
func (*Keeper) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable; it blocks until ctx is done.
func (k *Keeper) Start(ctx context.Context) error {
	o := k.Options
	byName := func(name string) fields.Selector { return fields.OneTermEqualSelector("metadata.name", name) }
	watched := map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Namespaces: map[string]cache.Config{o.Namespace: {}}, Field: byName(o.SecretName)},
	}
	if o.WebhookConfigName != "" {
		watched[&admissionregistrationv1.ValidatingWebhookConfiguration{}] = cache.ByObject{Field: byName(o.WebhookConfigName)}
	}
	if o.MutatingWebhookConfigName != "" {
		watched[&admissionregistrationv1.MutatingWebhookConfiguration{}] = cache.ByObject{Field: byName(o.MutatingWebhookConfigName)}
	}
	c, err := cache.New(k.Config, cache.Options{Scheme: k.Scheme, ByObject: watched})
	if err != nil {
		return fmt.Errorf("cannot create the webhook certificate watch: %w", err)
	}
	// kick holds at most one pending pass; events arriving while one is
	// pending coalesce into it.
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	for obj := range watched {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("cannot watch %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("cannot watch %T: %w", obj, err)
		}
	}
	cacheDone := make(chan error, 1)
	go func() { cacheDone <- c.Start(ctx) }()

	resync := k.Resync
	if resync <= 0 {
		resync = DefaultResync
	}
	ticker := time.NewTicker(resync)
	defer ticker.Stop()
	retry := time.NewTimer(0) // the first pass runs at once
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			<-cacheDone
			return nil
		case err := <-cacheDone:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("webhook certificate watch stopped: %w", err)
		case <-kick:
		case <-ticker.C:
		case <-retry.C:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := Ensure(pctx, k.Client, o)
		cancel()
		if err != nil && ctx.Err() == nil {
			k.Log.Error(err, "cannot keep the webhook certificate; retrying", "after", retryAfter)
			retry.Reset(retryAfter)
		}
	}
}
