package rulestest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// TestWebhookRequestCodeIsAlways200 pins why the webhook alerts read the
// kube-apiserver's metrics: controller-runtime's webhook server (the one the
// controller registers its webhooks with) counts
// controller_runtime_webhook_requests_total{code} from the HTTP status, and
// an admission webhook answers 200 for a handler error, a denial and even an
// undecodable request, so a rule on code=~"5.." could never fire.
func TestWebhookRequestCodeIsAlways200(t *testing.T) {
	const path = "/rulestest-always-200"
	srv := webhook.NewServer(webhook.Options{})
	srv.Register(path, &webhook.Admission{Handler: admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
		if req.Operation == "DELETE" {
			return admission.Denied("no")
		}
		return admission.Errored(http.StatusInternalServerError, errors.New("the handler failed"))
	})})
	review := func(op string) string {
		return `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","operation":"` + op +
			`","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"object":{}}}`
	}
	for _, body := range []string{review("CREATE"), review("DELETE"), "not json", ""} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.WebhookMux().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("body %q: HTTP %d; the premise of the webhook alerts changed, alert on the controller's code label", body, rec.Code)
		}
	}
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_webhook_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "webhook") == path {
				codes[label(m, "code")] += m.GetCounter().GetValue()
			}
		}
	}
	if codes["200"] != 4 {
		t.Errorf("code counts %v, want 4 requests under 200", codes)
	}
	for code, n := range codes {
		if code != "200" && n != 0 {
			t.Errorf("code %s counted %v requests: the controller does expose failures by code", code, n)
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
