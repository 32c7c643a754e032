package tokenizer

import (
	"container/heap"
	"fmt"
	"sync"
	"unicode/utf8"
)

// piece is a token of a word: its id and byte range in the word.
type piece struct {
	id         int
	start, end int
}

// model turns one word into tokens (Hugging Face's Model).
type model interface {
	tokenize(word []byte, out []piece) ([]piece, error)
	vocab() *vocabulary
}

// vocabulary maps tokens to ids and back.
type vocabulary struct {
	ids    map[string]int
	tokens []string // by id; "" where no token has the id
}

func newVocabulary(m map[string]int) (*vocabulary, error) {
	max := -1
	for tok, id := range m {
		if id < 0 {
			return nil, fmt.Errorf("token %q has the negative id %d", tok, id)
		}
		if id > max {
			max = id
		}
	}
	if max >= 1<<24 && max > 4*len(m) {
		return nil, fmt.Errorf("the vocabulary's ids are sparse (the largest is %d for %d tokens)", max, len(m))
	}
	v := &vocabulary{ids: m, tokens: make([]string, max+1)}
	for tok, id := range m {
		v.tokens[id] = tok
	}
	return v, nil
}

func (v *vocabulary) vocab() *vocabulary { return v }

// wordPiece is the WordPiece model: greedy longest-match-first subwords,
// continuing ones prefixed with "##".
type wordPiece struct {
	*vocabulary
	unk          string
	unkID        int
	hasUnk       bool
	prefix       string
	maxInputChar int
}

func (m *wordPiece) unkPiece(word []byte, out []piece) ([]piece, error) {
	if !m.hasUnk {
		return out, fmt.Errorf("WordPiece: the unknown token %q is not in the vocabulary", m.unk)
	}
	return append(out, piece{m.unkID, 0, len(word)}), nil
}

func (m *wordPiece) tokenize(word []byte, out []piece) ([]piece, error) {
	if utf8.RuneCount(word) > m.maxInputChar {
		return m.unkPiece(word, out)
	}
	n0 := len(out)
	var buf []byte
	for start := 0; start < len(word); {
		end := len(word)
		found := -1
		for start < end {
			var id int
			var ok bool
			if start > 0 {
				if buf == nil {
					buf = make([]byte, 0, len(m.prefix)+len(word))
				}
				buf = append(append(buf[:0], m.prefix...), word[start:end]...)
				id, ok = m.ids[string(buf)]
			} else {
				id, ok = m.ids[string(word[start:end])]
			}
			if ok {
				found = id
				break
			}
			_, w := utf8.DecodeLastRune(word[start:end])
			end -= w
		}
		if found < 0 {
			return m.unkPiece(word, out[:n0])
		}
		out = append(out, piece{found, start, end})
		start = end
	}
	return out, nil
}

// bpe is the BPE model: characters merged pair by pair, the pair of lowest
// rank first, with a cache of the words seen.
type bpe struct {
	*vocabulary
	merges       map[[2]int]merge
	unk          string
	unkID        int
	hasUnk       bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool

	mu    sync.RWMutex
	cache map[string][]piece
}

type merge struct{ rank, id int }

// bpeCacheSize is how many words the cache holds (as Hugging Face's).
const bpeCacheSize = 10000

func (m *bpe) tokenize(word []byte, out []piece) ([]piece, error) {
	if len(word) == 0 {
		return out, nil
	}
	if m.ignoreMerges {
		if id, ok := m.ids[string(word)]; ok {
			return append(out, piece{id, 0, len(word)}), nil
		}
	}
	m.mu.RLock()
	ps, ok := m.cache[string(word)]
	m.mu.RUnlock()
	if ok {
		return append(out, ps...), nil
	}
	w := string(word)
	ps, err := m.mergeWord(w)
	if err != nil {
		return out, err
	}
	m.mu.Lock()
	if len(m.cache) < bpeCacheSize {
		m.cache[w] = ps
	}
	m.mu.Unlock()
	return append(out, ps...), nil
}

// symbol is a node of the doubly linked list of a word's symbols.
type symbol struct {
	id, prev, next int
	start, end     int
	gone           bool
}

type mergeCand struct{ pos, rank, id int }

type mergeHeap []mergeCand

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(mergeCand)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (m *bpe) mergeWord(word string) ([]piece, error) {
	syms := make([]symbol, 0, len(word))
	add := func(id, start, end int) {
		syms = append(syms, symbol{id: id, prev: len(syms) - 1, next: len(syms) + 1, start: start, end: end})
	}
	unkID, unkStart, unkEnd, haveUnk := 0, 0, 0, false
	flushUnk := func() {
		if haveUnk {
			add(unkID, unkStart, unkEnd)
			haveUnk = false
		}
	}
	var buf []byte
	for i := 0; i < len(word); {
		_, w := utf8.DecodeRuneInString(word[i:])
		end := i + w
		s := word[i:end]
		if (i > 0 && m.prefix != "") || (end == len(word) && m.suffix != "") {
			buf = buf[:0]
			if i > 0 {
				buf = append(buf, m.prefix...)
			}
			buf = append(buf, s...)
			if end == len(word) {
				buf = append(buf, m.suffix...)
			}
			s = string(buf)
		}
		if id, ok := m.ids[s]; ok {
			flushUnk()
			add(id, i, end)
			i = end
			continue
		}
		if m.byteFallback {
			ids := make([]int, 0, len(s))
			for j := 0; j < len(s); j++ {
				id, ok := m.ids[fmt.Sprintf("<0x%02X>", s[j])]
				if !ok {
					ids = nil
					break
				}
				ids = append(ids, id)
			}
			if ids != nil {
				flushUnk()
				// Hugging Face gives each byte token a length of one byte
				// of the word.
				for k, id := range ids {
					add(id, i+k, i+k+1)
				}
				i = end
				continue
			}
		}
		if m.unk != "" {
			if !m.hasUnk {
				return nil, fmt.Errorf("BPE: the unknown token %q is not in the vocabulary", m.unk)
			}
			if haveUnk && m.fuseUnk {
				unkEnd = end
			} else {
				flushUnk()
				unkID, unkStart, unkEnd, haveUnk = m.unkID, i, end, true
			}
		}
		i = end
	}
	flushUnk()
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}

	h := make(mergeHeap, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if mg, ok := m.merges[[2]int{syms[i].id, syms[i+1].id}]; ok {
			h = append(h, mergeCand{i, mg.rank, mg.id})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		top := heap.Pop(&h).(mergeCand)
		cur := &syms[top.pos]
		if cur.gone || cur.next < 0 {
			continue
		}
		ri := cur.next
		right := syms[ri]
		if mg, ok := m.merges[[2]int{cur.id, right.id}]; !ok || mg.id != top.id {
			continue
		}
		cur.id = top.id
		cur.end = right.end
		cur.next = right.next
		syms[ri].gone = true
		nextPos := right.next
		if nextPos >= 0 {
			syms[nextPos].prev = top.pos
		}
		if cur.prev >= 0 {
			if mg, ok := m.merges[[2]int{syms[cur.prev].id, cur.id}]; ok {
				heap.Push(&h, mergeCand{cur.prev, mg.rank, mg.id})
			}
		}
		if nextPos >= 0 {
			if mg, ok := m.merges[[2]int{cur.id, syms[nextPos].id}]; ok {
				heap.Push(&h, mergeCand{top.pos, mg.rank, mg.id})
			}
		}
	}
	var out []piece
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		out = append(out, piece{syms[i].id, syms[i].start, syms[i].end})
	}
	return out, nil
}
