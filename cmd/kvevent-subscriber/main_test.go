package main

import (
	"context"
	"strings"
	"testing"
)

func TestRunRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model-id", "m"}, "--replica-id and --model-id are required"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--hash-scheme", ""}, "--hash-scheme"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--lora-adapter-names", "1"}, "LoRA"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--log-level", "loud"}, "--log-level"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--tls-cert-file", "c.pem"}, "cert and a key"},
		{[]string{"--no-such-flag"}, "not defined"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--data-parallel-size", "-1"}, "--data-parallel-size"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--data-parallel-size", "2", "--data-parallel-rank", "2"}, "--data-parallel-rank"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--data-parallel-rank", "1"}, "--data-parallel-rank"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--data-parallel-size", "2", "--engine-endpoint", "tcp://127.0.0.1"}, "cannot offset"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--engine-endpoint-mode", "listen"}, "--engine-endpoint-mode"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--engine-endpoint-mode", "bind", "--engine-endpoint", "tcp://*:5557"}, "bind endpoint"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--engine-endpoint-mode", "bind", "--engine-endpoint", "tcp://0.0.0.0:5557"}, "loopback"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--refresh-interval", "-1s"}, "--refresh-interval"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--refresh-interval", "often"}, "refresh-interval"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--server-heartbeat-interval", "-1s"}, "--server-heartbeat-interval"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--state-interval", "0s"}, "--state-interval"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--nats-url", "nats://127.0.0.1:1", "--nats-stream", "a b"}, "stream name"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--nats-url", "nats://127.0.0.1:1", "--nats-stream-replicas", "7"}, "replicas"},
		{[]string{"--replica-id", "r", "--model-id", "m", "--nats-url", "nats://127.0.0.1:1", "--nats-stream-max-bytes", "-1"}, "max bytes"},
	} {
		err := run(context.Background(), tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	if err := run(context.Background(), []string{"-h"}); err != nil {
		t.Errorf("-h: %v", err)
	}
}
