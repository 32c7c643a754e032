package cpuexec

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCrewRunsEveryChunkOnce has several goroutines post jobs at once, with
// and without pauses (helpers asleep or still spinning), and checks that
// every chunk of every job ran exactly once and had finished when run
// returned.
func TestCrewRunsEveryChunkOnce(t *testing.T) {
	const callers, calls, chunks = 6, 150, 40
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range calls {
				var next atomic.Int64
				var done [chunks]atomic.Int32
				work := func() {
					for {
						i := int(next.Add(1)) - 1
						if i >= chunks {
							return
						}
						if i%7 == 0 {
							time.Sleep(time.Microsecond)
						}
						done[i].Add(1)
					}
				}
				helpers.run(1+(c+k)%3, work)
				for i := range done {
					if n := done[i].Load(); n != 1 {
						t.Errorf("caller %d call %d: chunk %d ran %d times", c, k, i, n)
						return
					}
				}
				if k%50 == 0 {
					time.Sleep(2 * crewSpin) // let the helpers fall asleep
				}
			}
		}()
	}
	wg.Wait()
}
