package rendezvous

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/ferryml/ferry/ir"
)

// The protocol: every message is a frame, a 4-byte little-endian length n
// followed by n bytes, the first of which is the message type. A process
// opens with hello; the coordinator answers welcome when every process has
// joined, or refused. Then each collective is one call from every member of
// the communicator and one reply to each; abort goes either way, bye ends a
// process's part.
const (
	magic   = "FERRYRV\x00" // the first bytes of a hello
	version = 1
	// maxFrame bounds a frame's length, so that a stray peer cannot make a
	// process allocate without limit.
	maxFrame = 1 << 30
)

type msgType byte

const (
	mHello   msgType = iota + 1 // process → coordinator: magic, version, count, id, job
	mWelcome                    // coordinator → process: every process has joined
	mRefused                    // coordinator → process: code, why the job did not start
	mCall                       // process → coordinator: one rank's collective
	mReply                      // coordinator → process: the collective's result for one rank
	mAbort                      // either way: code, why the job failed
	mBye                        // process → coordinator: this process has closed
)

// Codes of refused and abort messages: which sentinel the error wraps.
const (
	codeOther   byte = iota
	codeJob          // ErrJob
	codeTimeout      // ErrTimeout
	codeLost         // ErrProcessLost
)

// kind is a collective that travels to the coordinator.
type kind byte

const (
	kBarrier kind = iota + 1
	kBroadcast
	kAllGather
	kSplit
)

var kindNames = [...]string{"invalid", "Barrier", "Broadcast", "AllGather", "Split"}

func (k kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("collective(%d)", byte(k))
}

// Reply statuses.
const (
	statusOK byte = iota
	statusMismatch
	statusInvalid
)

// call is one rank's collective, as sent to the coordinator.
type call struct {
	comm, seq uint64
	rank      int
	kind      kind
	dt        ir.DType
	root      int
	color     int
	key       int
	n         int    // the bytes each rank sends (Broadcast: the buffer's length)
	err       string // this rank's argument error, "" if none
	data      []byte // the bytes sent (Broadcast: only the root's)
}

// reply is the coordinator's answer to one rank's call.
type reply struct {
	comm, seq uint64
	status    byte
	msg       string // what is mismatched or invalid
	data      []byte
	// Split: the new communicator (0: none), this rank in it and the
	// processes of its ranks.
	newComm uint64
	newRank int
	members []int
}

type enc []byte

func (e enc) u(v uint64) enc     { return binary.AppendUvarint(e, v) }
func (e enc) i(v int) enc        { return binary.AppendVarint(e, int64(v)) }
func (e enc) bytes(b []byte) enc { return append(e.u(uint64(len(b))), b...) }
func (e enc) str(s string) enc   { return append(e.u(uint64(len(s))), s...) }

// dec reads what enc wrote; the first malformed field sets err and every
// later read returns zero.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail() {
	if d.err == nil {
		d.err = errors.New("malformed message")
	}
	d.b = nil
}

func (d *dec) u() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) i() int {
	v, n := binary.Varint(d.b)
	if n <= 0 || int64(int(v)) != v {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

func (d *dec) bytes() []byte {
	n := d.u()
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	b := d.b[:n:n]
	d.b = d.b[n:]
	return b
}

func (d *dec) str() string { return string(d.bytes()) }

func (d *dec) byte1() byte {
	if len(d.b) == 0 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (c *call) encode() []byte {
	e := enc{}.u(c.comm).u(c.seq).i(c.rank)
	e = append(e, byte(c.kind), byte(c.dt))
	return e.i(c.root).i(c.color).i(c.key).i(c.n).str(c.err).bytes(c.data)
}

func decodeCall(b []byte) (*call, error) {
	d := &dec{b: b}
	c := &call{comm: d.u(), seq: d.u(), rank: d.i()}
	c.kind, c.dt = kind(d.byte1()), ir.DType(d.byte1())
	c.root, c.color, c.key, c.n = d.i(), d.i(), d.i(), d.i()
	c.err, c.data = d.str(), d.bytes()
	return c, d.err
}

func (r *reply) encode() []byte {
	e := enc{}.u(r.comm).u(r.seq)
	e = append(e, r.status)
	e = e.str(r.msg).bytes(r.data).u(r.newComm).i(r.newRank).u(uint64(len(r.members)))
	for _, m := range r.members {
		e = e.i(m)
	}
	return e
}

func decodeReply(b []byte) (*reply, error) {
	d := &dec{b: b}
	r := &reply{comm: d.u(), seq: d.u(), status: d.byte1()}
	r.msg, r.data, r.newComm, r.newRank = d.str(), d.bytes(), d.u(), d.i()
	n := d.u()
	if n > uint64(len(d.b)) {
		d.fail()
	}
	for range n {
		r.members = append(r.members, d.i())
	}
	return r, d.err
}

// hello is a process's opening message.
type hello struct {
	version, count, id int
	job                string
}

func (h *hello) encode() []byte {
	return enc(magic).i(h.version).i(h.count).i(h.id).str(h.job)
}

// errNotFerry: the peer does not speak this protocol.
var errNotFerry = errors.New("not a Ferry rendezvous hello")

func decodeHello(b []byte) (*hello, error) {
	if len(b) < len(magic) || string(b[:len(magic)]) != magic {
		return nil, errNotFerry
	}
	d := &dec{b: b[len(magic):]}
	h := &hello{version: d.i(), count: d.i(), id: d.i(), job: d.str()}
	return h, d.err
}

// coded is the body of refused and abort messages: a code and a message.
func coded(code byte, msg string) []byte { return enc{code}.str(msg) }

func decodeCoded(b []byte) (byte, string, error) {
	d := &dec{b: b}
	code := d.byte1()
	return code, d.str(), d.err
}

// frame returns the bytes of one message.
func frame(t msgType, body []byte) []byte {
	f := make([]byte, 5, 5+len(body))
	binary.LittleEndian.PutUint32(f, uint32(1+len(body)))
	f[4] = byte(t)
	return append(f, body...)
}

// writeFrame writes one message in a single Write.
func writeFrame(w io.Writer, t msgType, body []byte) error {
	_, err := w.Write(frame(t, body))
	return err
}

// readFrame reads one frame.
func readFrame(r *bufio.Reader) (msgType, []byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n == 0 || n > maxFrame {
		return 0, nil, fmt.Errorf("bad frame length %d", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return msgType(b[0]), b[1:], nil
}
