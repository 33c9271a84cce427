package main

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// maxImageBytes is the size target of every image tarball.
const maxImageBytes = 40 << 20

// TestImages builds the three images twice from this checkout and checks
// what a cluster relies on: the same digests both times, the nonroot user,
// the entrypoint, the labels, a base with passwd/group/tmp, fixed times, and
// a binary that runs.
func TestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bi, err := GitInfo(ctx, repo)
	if err != nil {
		t.Fatal(err)
	}
	// A fixed CA file keeps the test independent of the machine's bundle.
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tag, err := KustomizeTag(repo)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Repo: repo, Arch: runtime.GOARCH, Build: bi, Tag: tag, CAFile: ca}
	o.Out = filepath.Join(t.TempDir(), "a")
	first, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	o.Out = filepath.Join(t.TempDir(), "b")
	second, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != len(Binaries) || len(second) != len(Binaries) {
		t.Fatalf("built %d and %d images, want %d each", len(first), len(second), len(Binaries))
	}
	for i, r := range first {
		t.Run(r.Name, func(t *testing.T) {
			if r.Digest != second[i].Digest || r.ConfigID != second[i].ConfigID {
				t.Errorf("not reproducible: %s/%s then %s/%s", r.Digest, r.ConfigID, second[i].Digest, second[i].ConfigID)
			}
			if r.Bytes > maxImageBytes {
				t.Errorf("tarball is %d bytes, target %d", r.Bytes, maxImageBytes)
			}
			t.Logf("%s: %.1f MB, digest %s", r.Ref, float64(r.Bytes)/1e6, r.Digest)
			if want := Repository + "/" + r.Name + ":" + tag; r.Ref != want {
				t.Errorf("tagged %s, want %s (the manifests' pin)", r.Ref, want)
			}
			checkImage(t, ctx, r, bi)
			checkPush(t, r)
		})
	}
}

// checkPush pushes the tarball to a registry on 127.0.0.1 as `crane push`
// does and checks the registry stores it under the digest Build reported.
func checkPush(t *testing.T, r Result) {
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	img, err := tarball.ImageFromPath(r.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://") + "/inferencecache/" + r.Name + ":test")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push: %v", err)
	}
	desc, err := remote.Head(ref)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != r.Digest {
		t.Errorf("the registry holds %s as %s, Build reported %s", ref, desc.Digest, r.Digest)
	}
}

func checkImage(t *testing.T, ctx context.Context, r Result, bi BuildInfo) {
	ref, err := name.NewTag(r.Ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(r.Path, &ref) // fails unless the tarball carries that tag

	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cf.Config.User)
	}
	if want := "/" + r.Name; len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != want {
		t.Errorf("entrypoint %q, want [%s]", cf.Config.Entrypoint, want)
	}
	if !cf.Created.Equal(bi.Created) {
		t.Errorf("created %s, want the commit time %s", cf.Created, bi.Created)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.source":   Source,
		"org.opencontainers.image.version":  bi.Version,
		"org.opencontainers.image.revision": bi.Revision,
		"org.opencontainers.image.created":  bi.Created.Format(time.RFC3339),
	} {
		if got := cf.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Fatalf("%d layers, want base and binary", len(layers))
	}
	base := readLayer(t, layers[0], bi.Created, nil)
	for _, want := range []string{"etc/passwd", "etc/group", "etc/nsswitch.conf", "etc/ssl/certs/ca-certificates.crt", "tmp/", "home/nonroot/"} {
		if _, ok := base[want]; !ok {
			t.Errorf("base layer lacks %s", want)
		}
	}
	if h := base["tmp/"]; h != nil && h.Mode != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", h.Mode)
	}
	if h := base["home/nonroot/"]; h != nil && (h.Uid != Nonroot || h.Gid != Nonroot) {
		t.Errorf("/home/nonroot owned by %d:%d, want %d:%d", h.Uid, h.Gid, Nonroot, Nonroot)
	}

	// The binary: extract it and run --help, as the kubelet would run the
	// entrypoint (without the container around it).
	dir := t.TempDir()
	bin := filepath.Join(dir, r.Name)
	top := readLayer(t, layers[1], bi.Created, func(h *tar.Header, body io.Reader) {
		if h.Name != r.Name {
			return
		}
		f, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, body); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	})
	h, ok := top[r.Name]
	if !ok || len(top) != 1 {
		t.Fatalf("binary layer holds %d entries, want only %s", len(top), r.Name)
	}
	if h.Mode != 0o755 || h.Uid != 0 {
		t.Errorf("/%s mode %o uid %d, want 755 root-owned", r.Name, h.Mode, h.Uid)
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(hctx, bin, "--help")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", r.Name, err, out)
	}
	if !strings.Contains(string(out), "Usage") {
		t.Errorf("%s --help printed no usage:\n%s", r.Name, out)
	}
}

// readLayer reads a layer's tar and checks it is sorted and every time is
// t0; each regular file's body goes to fn when fn is non-nil.
func readLayer(t *testing.T, l v1.Layer, t0 time.Time, fn func(*tar.Header, io.Reader)) map[string]*tar.Header {
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	hs := map[string]*tar.Header{}
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(t0) {
			t.Errorf("%s: mtime %s, want %s", h.Name, h.ModTime, t0)
		}
		hs[h.Name] = h
		names = append(names, h.Name)
		if fn != nil && h.Typeflag == tar.TypeReg {
			fn(h, tr)
		}
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("layer entries not sorted: %q", names)
	}
	return hs
}

func TestKustomizeTag(t *testing.T) {
	for name, c := range map[string]struct {
		file, want, err string
	}{
		"pinned":    {file: "images:\n- name: a\n  newTag: v1.2.3\n- name: b\n  newTag: \"v1.2.3\"\n", want: "v1.2.3"},
		"latest":    {file: "images:\n- name: a\n  newTag: latest\n", err: "pin a version"},
		"two tags":  {file: "images:\n- name: a\n  newTag: v1\n- name: b\n  newTag: v2\n", err: "both"},
		"no images": {file: "resources:\n- ../crd\n", err: "pins no image tag"},
	} {
		t.Run(name, func(t *testing.T) {
			repo := t.TempDir()
			dir := filepath.Join(repo, "operator", "config", "default")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(c.file), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := KustomizeTag(repo)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("KustomizeTag() = %q, %v; want error %q", got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("KustomizeTag() = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}
