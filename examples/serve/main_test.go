package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The load test against the small random model (no model directory):
// every request succeeds, nothing compiles during the load, and the report
// has its figures.
func TestLoadSmallModel(t *testing.T) {
	var out bytes.Buffer
	o := options{model: filepath.Join(t.TempDir(), "none"), load: true, clients: 4, texts: 3,
		duration: 300 * time.Millisecond, wait: 2 * time.Millisecond, queue: 64}
	if err := run(&out, o); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	t.Log(s)
	for _, want := range []string{"a small random BERT", "failed: 0, compiles during the load: 0"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if !regexp.MustCompile(`throughput: [0-9.]+ texts/s, [0-9.]+ requests/s \([1-9]`).MatchString(s) ||
		!regexp.MustCompile(`latency: p50 [0-9.]+ ms, p99 [0-9.]+ ms`).MatchString(s) {
		t.Errorf("output lacks the throughput or latency")
	}
}

// -model with a Llama or GPT-2 directory serves generation: the load test
// answers every request, compiles nothing during the load, and reports
// tokens/s and latency.
func TestLoadGenerate(t *testing.T) {
	for _, dir := range []string{"llama", "gpt2"} {
		var out bytes.Buffer
		o := options{model: filepath.Join("..", "..", "nn", "hf", "testdata", dir), load: true, clients: 4,
			duration: 300 * time.Millisecond, wait: 2 * time.Millisecond, queue: 64, maxTokens: 6, maxLen: 16}
		if err := run(&out, o); err != nil {
			t.Fatalf("%s: %v\n%s", dir, err, out.String())
		}
		s := out.String()
		t.Log(s)
		if !strings.Contains(s, "failed: 0, decode step compiles during the load: 0") ||
			!regexp.MustCompile(`throughput: [0-9.]+ tokens/s, [0-9.]+ requests/s \([1-9]`).MatchString(s) ||
			!regexp.MustCompile(`latency: p50 [0-9.]+ ms, p99 [0-9.]+ ms`).MatchString(s) {
			t.Errorf("%s: the report lacks the throughput, the latency or a clean run", dir)
		}
	}
}
