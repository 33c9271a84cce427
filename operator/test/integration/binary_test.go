package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/internal/testbin"
)

// freePorts returns n distinct ports on 127.0.0.1 that were free a moment
// ago. Every listener stays open until all n are chosen: closed one by one,
// the kernel may hand the same port out twice, and the binary then fails
// to bind its second server ("address already in use").
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	ports := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, fmt.Sprint(l.Addr().(*net.TCPAddr).Port))
	}
	return ports
}

// kubeconfig writes cfg (envtest's admin client certificate) as a kubeconfig
// that acts as the user as (impersonation; "" acts as admin).
func kubeconfig(t *testing.T, as string) string {
	t.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	c.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Impersonate: as}
	c.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	c.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*c, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestControllerBinary builds cmd/controller and runs it as the Deployment
// does (leader election, self-signed webhook certificate, probes, metrics
// over HTTPS for a metrics-reader token),
// as the controller's ServiceAccount with exactly the RBAC of
// operator/config/rbac, against the envtest apiserver and the test server,
// then stops it with SIGTERM. No request may be forbidden.
func TestControllerBinary(t *testing.T) {
	ctx := needEnv(t)
	applyRBAC(t, ctx)
	dir := t.TempDir()
	bin := filepath.Join(dir, "controller")
	if err := testbin.Build(ctx, dir, "./cmd/controller"); err != nil {
		t.Fatal(err)
	}

	// A webhook configuration matching nothing, to receive the caBundle. It
	// and the certificate Secret carry the names the RBAC grants access to.
	none := admissionv1.SideEffectClassNone
	ignore := admissionv1.Ignore
	path := "/unused"
	vwc := &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-validating-webhook"},
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name:                    "binary-test.inferencecache.io",
			ClientConfig:            admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Namespace: controllerNS, Name: "binary-test-webhook", Path: &path}},
			Rules:                   []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create}, Rule: admissionv1.Rule{APIGroups: []string{"binary-test.invalid"}, APIVersions: []string{"v1"}, Resources: []string{"nothing"}}}},
			SideEffects:             &none,
			FailurePolicy:           &ignore,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	wantOK(t, "create webhook configuration", k8s.Create(ctx, vwc))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), vwc) })

	ports := freePorts(t, 3)
	metricsPort, probePort, webhookPort := ports[0], ports[1], ports[2]
	cmd := exec.Command(bin,
		"--server-address=http://"+srv.addr,
		"--policy-token-path="+filepath.Join(tokenDir, "policy"),
		"--controller-token-path="+filepath.Join(tokenDir, "controller"),
		"--push-interval=1s", "--snapshot-interval=1s",
		"--metrics-bind-address=127.0.0.1:"+metricsPort,
		"--health-probe-bind-address=127.0.0.1:"+probePort,
		"--leader-elect", "--leader-election-id=binary-test.inferencecache.io",
		"--enable-webhooks", "--webhook-host=127.0.0.1", "--webhook-port="+webhookPort,
		"--webhook-cert-dir="+t.TempDir(),
		"--webhook-secret-name=inferencecache-webhook-cert",
		"--webhook-service-name=binary-test-webhook",
		"--webhook-config-name=inferencecache-validating-webhook",
	)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig(t, auth.ServiceAccountPrefix+controllerNS+":"+controllerSA), "POD_NAMESPACE="+controllerNS)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("controller output:\n%s", logs.String())
		}
	}()

	hc := &http.Client{Timeout: 5 * time.Second}
	get := func(url string) (int, string, error) {
		resp, err := hc.Get(url) //nolint:noctx // bounded by the client timeout
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		return resp.StatusCode, string(b), nil
	}
	eventually(t, 60*time.Second, func() error {
		code, _, err := get("http://127.0.0.1:" + probePort + "/readyz")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("readyz %d %v", code, err)
		}
		return nil
	})

	// The self-signed CA is stored, set as caBundle, and signs what the
	// webhook port serves for the Service's DNS name.
	var sec corev1.Secret
	wantOK(t, "certificate secret", k8s.Get(ctx, client.ObjectKey{Namespace: controllerNS, Name: "inferencecache-webhook-cert"}, &sec))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), &sec) })
	wantOK(t, "get webhook configuration", k8s.Get(ctx, client.ObjectKeyFromObject(vwc), vwc))
	if ca := vwc.Webhooks[0].ClientConfig.CABundle; len(ca) == 0 || !bytes.Equal(ca, sec.Data["ca.crt"]) {
		t.Fatalf("caBundle not set from the secret (%d bytes)", len(ca))
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(sec.Data["ca.crt"])
	conn, err := tls.Dial("tcp", "127.0.0.1:"+webhookPort, &tls.Config{RootCAs: pool, ServerName: "binary-test-webhook." + controllerNS + ".svc"})
	wantOK(t, "TLS handshake with the webhook server", err)
	_ = conn.Close()

	// The pod-injection configuration, created after start-up, gets the
	// same caBundle; the validating one, deleted and re-created without a
	// caBundle (a re-apply of the manifests), gets it back. Both are watched
	// by name under the shipped RBAC.
	_, mwc := keeperConfigs("unused", "inferencecache-mutating-webhook")
	wantOK(t, "create mutating webhook configuration", k8s.Create(ctx, mwc))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), mwc) })
	wantOK(t, "delete webhook configuration", k8s.Delete(ctx, vwc))
	vwc.ResourceVersion, vwc.UID, vwc.Webhooks[0].ClientConfig.CABundle = "", "", nil
	wantOK(t, "re-create webhook configuration", k8s.Create(ctx, vwc))
	eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(vwc), vwc); err != nil {
			return err
		}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(mwc), mwc); err != nil {
			return err
		}
		if !bytes.Equal(vwc.Webhooks[0].ClientConfig.CABundle, sec.Data["ca.crt"]) || !bytes.Equal(mwc.Webhooks[0].ClientConfig.CABundle, sec.Data["ca.crt"]) {
			return fmt.Errorf("caBundle not (yet) restored on the validating and set on the mutating configuration")
		}
		return nil
	})

	// It holds the leader Lease and runs the controllers.
	eventually(t, 30*time.Second, func() error {
		var lease coordinationv1.Lease
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: controllerNS, Name: "binary-test.inferencecache.io"}, &lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return errNotYet
		}
		return nil
	})
	// /metrics is HTTPS behind the token review by default (--metrics-secure),
	// which the controller does under the shipped RBAC.
	scrape := scrapeAsReader(t, ctx, "https://127.0.0.1:"+metricsPort+"/metrics")
	eventually(t, 30*time.Second, func() error {
		body, err := scrape()
		if err != nil {
			return err
		}
		for _, want := range []string{
			`controller_runtime_reconcile_total{controller="policy-propagation",result="success"}`,
			`controller_runtime_reconcile_total{controller="cache-snapshot",result="success"}`,
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("metrics lack %s", want)
			}
		}
		return nil
	})

	// SIGTERM stops it cleanly.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("controller exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("controller did not stop within 30s of SIGTERM")
	}
	// Every call was allowed by the shipped RBAC.
	if out := logs.String(); strings.Contains(out, "forbidden") {
		t.Fatalf("a request of the controller was forbidden by its RBAC:\n%s", out)
	}
	// It gave the Lease up on the way out, so the next replica leads at once
	// instead of after the lease duration.
	var lease coordinationv1.Lease
	wantOK(t, "get lease", k8s.Get(ctx, client.ObjectKey{Namespace: controllerNS, Name: "binary-test.inferencecache.io"}, &lease))
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Fatalf("the stopped controller still holds the leader Lease (holder %q)", *h)
	}
}
