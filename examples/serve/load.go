package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/ferryml/ferry/nn/serve"
)

// sentences are what the load test's clients send, of 5 to 40 tokens.
var sentences = []string{
	"A man is eating food.",
	"A man is eating a piece of bread.",
	"A man is riding a horse.",
	"A woman is playing violin.",
	"The new movie is awesome.",
	"Two men pushed carts through the woods.",
	"A monkey is playing drums.",
	"The cat sits outside on the warm stone steps of the old house.",
	"Stock markets fell sharply on Tuesday after the central bank raised interest rates again.",
	"How do I reset my password if I no longer have access to the email address on my account?",
	"Photosynthesis converts light energy into chemical energy stored in glucose.",
	"The quick brown fox jumps over the lazy dog.",
	"She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
	"Please find attached the quarterly report, the updated budget and the minutes of last week's meeting.",
	"Rain.",
	"Go programs that embed a runtime mostly want to serve a model behind an HTTP endpoint with a bounded queue.",
}

// report is what a load test measured: units are the texts embedded or
// the tokens generated.
type report struct {
	requests, units, rejected, failed int
	latencies                         []time.Duration
	elapsed                           time.Duration
}

// runLoad runs o.clients clients for o.duration, each sending requests one
// after another through send (its status, 0 when it got none, and the
// units it was answered with), with a random source seeded by the client
// and stream.
func runLoad(o options, stream uint64, send func(client *http.Client, r *rand.Rand) (status, units int)) *report {
	rep := &report{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(o.duration)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.clients}}
	for c := range o.clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), stream))
			for time.Now().Before(deadline) {
				t0 := time.Now()
				status, units := send(client, r)
				lat := time.Since(t0)
				mu.Lock()
				switch status {
				case http.StatusOK:
					rep.requests++
					rep.units += units
					rep.latencies = append(rep.latencies, lat)
				case http.StatusServiceUnavailable:
					rep.rejected++
				default:
					rep.failed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	rep.elapsed = time.Since(start)
	return rep
}

// loadTest runs o.clients clients against url for o.duration, each posting
// 1 to o.texts sentences per request.
func loadTest(url string, o options) *report {
	return runLoad(o, 1, func(client *http.Client, r *rand.Rand) (int, int) {
		n := 1 + r.IntN(o.texts)
		texts := make([]string, n)
		for i := range texts {
			texts[i] = sentences[r.IntN(len(sentences))]
		}
		return post(client, url, texts), n
	})
}

// post sends one request and returns its status (0 when it did not get one).
func post(client *http.Client, url string, texts []string) int {
	body, _ := json.Marshal(serve.EmbedRequest{Texts: texts})
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		var out serve.EmbedResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Embeddings) != len(texts) {
			return 0
		}
		return http.StatusOK
	}
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// quantile returns the q-quantile of sorted durations.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// printRates writes the throughput (units named unit) and latency lines of
// the report.
func (rep *report) printRates(w io.Writer, unit string) {
	sec := rep.elapsed.Seconds()
	fmt.Fprintf(w, "throughput: %.1f %s/s, %.1f requests/s (%d requests, %d %s)\n",
		float64(rep.units)/sec, unit, float64(rep.requests)/sec, rep.requests, rep.units, unit)
	slices.Sort(rep.latencies)
	fmt.Fprintf(w, "latency: p50 %.1f ms, p99 %.1f ms\n",
		ms(quantile(rep.latencies, 0.50)), ms(quantile(rep.latencies, 0.99)))
}

// print writes the report.
func (rep *report) print(w io.Writer, o options, s serve.Stats, compiles int64) {
	sec := rep.elapsed.Seconds()
	fmt.Fprintf(w, "%d clients for %.1f s, 1 to %d texts per request, max wait %v\n", o.clients, sec, o.texts, o.wait)
	rep.printRates(w, "texts")
	if s.Batches > 0 {
		fmt.Fprintf(w, "batches: %d, %.1f texts each, %.0f%% of the tokens run were padding\n",
			s.Batches, float64(s.Texts)/float64(s.Batches), 100*(1-float64(s.Tokens)/float64(s.Slots)))
	}
	fmt.Fprintf(w, "rejected (503): %d, failed: %d, compiles during the load: %d\n", rep.rejected, rep.failed, compiles)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
