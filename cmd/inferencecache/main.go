// Command inferencecache is the operator's toolbox. Its one subcommand today
// is doctor, the read-only pre-flight diagnostic of an installation (package
// doctor): it prints coded findings and exits 0 (all OK or INFO), 1 (a WARN),
// 2 (a FAIL) or 3 (usage or internal error).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/inferencecache/inferencecache/doctor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: inferencecache <command> [flags]

commands:
  doctor   read-only pre-flight checks of an installation (inferencecache doctor -h)
`

// run dispatches a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return doctor.ExitUsage
	}
	switch args[0] {
	case "doctor":
		return runDoctor(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "inferencecache: unknown command %q\n%s", args[0], usage)
	return doctor.ExitUsage
}

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var (
		o                    doctor.Options
		format, kubeconfig   string
		kubeContext, caFile  string
		grpcTLS, skipCluster bool
		namespaceFlag        string
	)
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: inferencecache doctor [flags]\n\n"+
			"Read-only checks of an inferencecache installation; codes and fixes in doctor/README.md.\n"+
			"Exit: 0 all OK/INFO, 1 a WARN, 2 a FAIL, 3 usage or internal error.\n\nflags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&format, "o", doctor.FormatHuman, "output format: human, json or table")
	fs.StringVar(&format, "output", doctor.FormatHuman, "output format: human, json or table (same as -o)")
	fs.StringVar(&o.GRPCAddr, "grpc-addr", "inferencecache-server.inferencecache-system.svc:9090", "server gRPC address for the grpc.health.v1 check (empty: skip)")
	fs.BoolVar(&grpcTLS, "grpc-tls", false, "dial the gRPC address with TLS (system roots unless --grpc-ca-file)")
	fs.StringVar(&caFile, "grpc-ca-file", "", "PEM CA bundle that signs the server's gRPC certificate (implies --grpc-tls)")
	fs.StringVar(&o.ControlURL, "control-url", "http://inferencecache-server.inferencecache-system.svc:8081", "server internal control address, http://host:port or host:port (/snapshot, /policy, /probe; empty: skip)")
	fs.StringVar(&o.ControllerTokenPath, "controller-token-path", "/var/run/secrets/inferencecache.io/controller-token/token", "file of a token with audience inferencecache.io/controller, sent to /snapshot and /probe (empty: none)")
	fs.StringVar(&o.PolicyTokenPath, "policy-token-path", "/var/run/secrets/inferencecache.io/policy-token/token", "file of a token with audience inferencecache.io/policy, sent to /policy (empty: none)")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: KUBECONFIG, ~/.kube/config, then in-cluster)")
	fs.StringVar(&kubeContext, "context", "", "kubeconfig context (default: the current one)")
	fs.StringVar(&namespaceFlag, "namespace", "", "check only this namespace (default: all namespaces)")
	fs.StringVar(&namespaceFlag, "n", "", "same as --namespace")
	ctl := doctor.DefaultController()
	fs.StringVar(&ctl.Namespace, "controller-namespace", ctl.Namespace, "namespace of the controller's Deployment and leader Lease")
	fs.StringVar(&ctl.Deployment, "controller-deployment", ctl.Deployment, "controller Deployment whose available replicas are checked (empty: skip)")
	fs.StringVar(&ctl.LeaderLease, "leader-election-id", ctl.LeaderLease, "the controller's leader election Lease, its --leader-election-id (empty: skip)")
	fs.StringVar(&ctl.ValidatingWebhook, "validating-webhook-config", ctl.ValidatingWebhook, "ValidatingWebhookConfiguration whose caBundles and Service are checked (empty: skip)")
	fs.StringVar(&ctl.MutatingWebhook, "mutating-webhook-config", ctl.MutatingWebhook, "MutatingWebhookConfiguration (engine pod injection) whose caBundle and Service are checked (empty: skip)")
	fs.DurationVar(&o.DriftGrace, "cacheindex-grace", doctor.DefaultDriftGrace, "how long CacheIndex may disagree with the live /snapshot before it is a WARN (IC271); above the controller's --snapshot-interval")
	fs.BoolVar(&o.ConfigOnly, "config-only", false, "cluster checks only: no gRPC or HTTP call to the server (token files are not read either)")
	fs.BoolVar(&skipCluster, "skip-cluster", false, "data-plane checks only: no Kubernetes API call")
	fs.DurationVar(&o.Timeout, "timeout", doctor.DefaultTimeout, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return doctor.ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "doctor: unexpected arguments %q\n", fs.Args())
		return doctor.ExitUsage
	}
	switch format {
	case doctor.FormatHuman, doctor.FormatJSON, doctor.FormatTable:
	default:
		fmt.Fprintf(stderr, "doctor: -o must be human, json or table, got %q\n", format)
		return doctor.ExitUsage
	}
	if o.Timeout <= 0 {
		fmt.Fprintln(stderr, "doctor: --timeout must be positive")
		return doctor.ExitUsage
	}
	if o.DriftGrace <= 0 {
		fmt.Fprintln(stderr, "doctor: --cacheindex-grace must be positive")
		return doctor.ExitUsage
	}
	if ctl.Namespace == "" && (ctl.Deployment != "" || ctl.LeaderLease != "") {
		fmt.Fprintln(stderr, "doctor: --controller-namespace is required for --controller-deployment and --leader-election-id")
		return doctor.ExitUsage
	}
	if skipCluster && o.ConfigOnly {
		fmt.Fprintln(stderr, "doctor: --config-only and --skip-cluster together check nothing")
		return doctor.ExitUsage
	}
	if grpcTLS || caFile != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				fmt.Fprintf(stderr, "doctor: cannot read --grpc-ca-file: %v\n", err)
				return doctor.ExitUsage
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				fmt.Fprintf(stderr, "doctor: no PEM certificate in --grpc-ca-file %s\n", caFile)
				return doctor.ExitUsage
			}
		}
		o.GRPCTLS = cfg
	}
	// The client's own logs would only repeat what the findings say; an
	// unset logger also makes controller-runtime print a warning.
	ctrllog.SetLogger(logr.Discard())
	o.Namespace = namespaceFlag
	if o.ControlURL != "" && !strings.Contains(o.ControlURL, "://") {
		o.ControlURL = "http://" + o.ControlURL // host:port, as the server's own flags take it
	}
	if !skipCluster {
		o.Controller = &ctl
		cfg, _, err := doctor.ClusterConfig(kubeconfig, kubeContext)
		if err == nil {
			o.ClusterHost = cfg.Host
			o.Cluster, err = doctor.NewClusterClient(cfg, o.Timeout)
		}
		o.ClusterErr = err
	}

	r := doctor.Run(ctx, o)
	if err := doctor.Write(stdout, r, format); err != nil {
		fmt.Fprintf(stderr, "doctor: cannot write the report: %v\n", err)
		return doctor.ExitUsage
	}
	return r.ExitCode
}
