package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	var o Options
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.StringVar(&o.Repo, "repo", "../..", "root of the inferencecache module")
	fs.StringVar(&o.Out, "out", "../../bin/images", "folder the tarballs are written to")
	fs.StringVar(&o.Arch, "arch", runtime.GOARCH, "GOARCH of the binaries and images")
	fs.StringVar(&o.Tag, "tag", "", "image tag (empty: the one operator/config/default pins)")
	fs.StringVar(&o.CAFile, "ca-file", "", "CA bundle to put in the images (empty: the build machine's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if o.Repo, err = filepath.Abs(o.Repo); err != nil {
		return err
	}
	if o.Build, err = GitInfo(ctx, o.Repo); err != nil {
		return err
	}
	if o.Tag == "" {
		if o.Tag, err = KustomizeTag(o.Repo); err != nil {
			return err
		}
	}
	start := time.Now()
	res, err := Build(ctx, o)
	if err != nil {
		return err
	}
	for _, r := range res {
		fmt.Printf("%-52s %6.1f MB  %s  id %s\n", r.Ref, float64(r.Bytes)/1e6, r.Digest, r.ConfigID.Hex[:12])
	}
	fmt.Printf("built %d images in %s into %s\n", len(res), time.Since(start).Round(100*time.Millisecond), o.Out)
	return nil
}
