package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/inferencecache/inferencecache/operator/manager"
)

// metricsToken creates ServiceAccount name in ns and returns a token of it
// from the TokenRequest API. bound binds it to the ClusterRole
// inferencecache-metrics-reader with prometheus/'s own binding (renamed,
// its subject replaced), so that manifest's roleRef is what is tested.
func metricsToken(t *testing.T, ctx context.Context, ns, name string, bound bool) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	wantOK(t, "create ServiceAccount "+name, k8s.Create(ctx, sa))
	if bound {
		crb := find(render(t, "../../config/prometheus"), "ClusterRoleBinding", "inferencecache-metrics-reader")
		if crb == nil {
			t.Fatal("prometheus/ has no ClusterRoleBinding inferencecache-metrics-reader")
		}
		crb.SetName("inferencecache-metrics-reader-" + ns + "-" + name)
		crb.Object["subjects"] = []any{map[string]any{"kind": "ServiceAccount", "name": name, "namespace": ns}}
		wantOK(t, "create metrics-reader binding", k8s.Create(ctx, crb))
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), crb) })
	}
	exp := int64(3600)
	tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	wantOK(t, "token of "+name, err)
	return tr.Status.Token
}

// scrapeResult is one GET of /metrics.
type scrapeResult struct {
	code  int
	proto string
	body  string
}

// scrapeHTTPS GETs url with token as bearer (none when empty). The
// certificate is self-signed, so it is not verified; HTTP/2 is offered, to
// see it refused.
func scrapeHTTPS(ctx context.Context, url, token string) (scrapeResult, error) {
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the server's certificate is self-signed
		ForceAttemptHTTP2: true,
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: 15 * time.Second, Transport: tr}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return scrapeResult{}, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return scrapeResult{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return scrapeResult{code: resp.StatusCode, proto: resp.Proto, body: string(b)}, err
}

// TestMetricsSecure runs the metrics server as manager.Run configures it
// for --metrics-secure, as the controller's ServiceAccount with the RBAC of
// operator/config/rbac, against the envtest apiserver: HTTPS only, no
// token or a bad one 401, a valid token without the metrics-reader role
// 403, with it 200 and the Prometheus text format.
func TestMetricsSecure(t *testing.T) {
	ctx := needEnv(t)
	applyRBAC(t, ctx)
	ns := namespace(t, ctx, "metrics-auth", false)
	nobody := metricsToken(t, ctx, ns, "nobody", false)
	reader := metricsToken(t, ctx, ns, "reader", true)

	opts, err := manager.MetricsServerOptions(manager.Options{MetricsAddr: "127.0.0.1:0", MetricsSecure: true})
	wantOK(t, "metrics options", err)
	if !opts.SecureServing || opts.FilterProvider == nil {
		t.Fatalf("--metrics-secure gives SecureServing %v, filter %v", opts.SecureServing, opts.FilterProvider != nil)
	}
	// The reviews go to the apiserver as the controller, so only the
	// shipped metrics-auth role lets them through.
	ccfg := impersonated(cfg)
	hc, err := rest.HTTPClientFor(ccfg)
	wantOK(t, "HTTP client", err)
	ms, err := metricsserver.NewServer(opts, ccfg, hc)
	wantOK(t, "metrics server", err)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ms.Start(sctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("metrics server: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("metrics server did not stop within 15s")
		}
	}()
	bound, ok := ms.(interface{ GetBindAddr() string })
	if !ok {
		t.Fatalf("metrics server %T does not report its address", ms)
	}
	var addr string
	eventually(t, 10*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("metrics server stopped: %v", err)
		default:
		}
		if addr = bound.GetBindAddr(); addr == "" {
			return errNotYet
		}
		return nil
	})
	url := "https://" + addr + "/metrics"

	// Plain HTTP gets nothing but the TLS server's refusal.
	plain := &http.Client{Timeout: 5 * time.Second}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if resp, err := plain.Do(req); err == nil {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), "controller_runtime_") {
			t.Errorf("plain HTTP got %d %q, want 400 and no metrics", resp.StatusCode, b)
		}
	}

	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		// controller-runtime's filter answers a token the TokenReview
		// rejects with 500, not 401: its authenticator reports that as an
		// error. Either way no metrics.
		{"rejected token", "not-a-token", http.StatusInternalServerError},
		{"no RBAC", nobody, http.StatusForbidden},
		{"metrics-reader", reader, http.StatusOK},
	} {
		res, err := scrapeHTTPS(ctx, url, tc.token)
		wantOK(t, "scrape "+tc.name, err)
		if res.code != tc.want {
			t.Errorf("%s: %d %.200q, want %d", tc.name, res.code, res.body, tc.want)
			continue
		}
		if res.proto != "HTTP/1.1" {
			t.Errorf("%s: served over %s, want HTTP/1.1 only", tc.name, res.proto)
		}
		if tc.want != http.StatusOK {
			if strings.Contains(res.body, "controller_runtime_") {
				t.Errorf("%s: metrics served with %d", tc.name, res.code)
			}
			continue
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		families, err := p.TextToMetricFamilies(strings.NewReader(res.body))
		wantOK(t, "parse the exposition", err)
		var runtimeFamilies []string
		for name := range families {
			if strings.HasPrefix(name, "controller_runtime_") {
				runtimeFamilies = append(runtimeFamilies, name)
			}
		}
		if len(runtimeFamilies) == 0 {
			t.Errorf("%d metric families, none controller_runtime_*", len(families))
		}
		if _, ok := families["controller_runtime_reconcile_total"]; !ok {
			t.Errorf("no controller_runtime_reconcile_total among %v", runtimeFamilies)
		}
	}
}

// scrapeAsReader returns a function that scrapes url with the token of a
// fresh ServiceAccount bound to the metrics-reader role, for the tests
// that run the controller binary.
func scrapeAsReader(t *testing.T, ctx context.Context, url string) func() (string, error) {
	t.Helper()
	ns := namespace(t, ctx, "metrics-scraper", false)
	token := metricsToken(t, ctx, ns, "scraper", true)
	return func() (string, error) {
		res, err := scrapeHTTPS(ctx, url, token)
		if err != nil {
			return "", err
		}
		if res.code != http.StatusOK {
			return "", fmt.Errorf("scrape: %d %.200q", res.code, res.body)
		}
		return res.body, nil
	}
}
