package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/ferryml/ferry/internal/settings"
)

// jaxProc is the long-lived Python process running bench/jax/bench.py: one
// JSON request line (plus raw array bytes) in, one JSON reply line (plus raw
// bytes) out; bench.py documents the protocol.
type jaxProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// findPython returns the Python to run bench.py with and bench.py's path:
// $FERRY_PYTHON, else .venv/bin/python under the repository root (the
// directory above the working directory holding go.mod and bench/jax/bench.py).
func findPython() (python, script string, err error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", "", err
	}
	root := ""
	for d := dir; ; d = filepath.Dir(d) {
		if fileExists(filepath.Join(d, "go.mod")) && fileExists(filepath.Join(d, "bench", "jax", "bench.py")) {
			root = d
			break
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	if root == "" {
		return "", "", fmt.Errorf("bench/jax/bench.py not found above %s: run from the Ferry repository", dir)
	}
	script = filepath.Join(root, "bench", "jax", "bench.py")
	if p := settings.Python.Get(); p != "" {
		return p, script, nil
	}
	python = filepath.Join(root, ".venv", "bin", "python")
	if !fileExists(python) {
		return "", "", fmt.Errorf("no Python with JAX at %s: make it with `bash scripts/venv` "+
			"(from %s; it installs the pinned conformance/requirements.txt), or set FERRY_PYTHON to a Python with jax and optax", python, root)
	}
	return python, script, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// startJAX starts bench.py with python; its stderr goes to ours.
func startJAX(python, script string) (*jaxProc, error) {
	cmd := exec.Command(python, "-u", script)
	cmd.Env = append(os.Environ(), "JAX_PLATFORMS=cpu")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", python, err)
	}
	return &jaxProc{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20)}, nil
}

// request sends one request with arrays and decodes the reply into v (a
// pointer to a struct or map); it returns the reply's raw bytes, if any.
func (j *jaxProc) request(req map[string]any, arrays []Tensor, v any) ([]byte, error) {
	if len(arrays) > 0 {
		req["arrays"] = arrays
	}
	line, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(j.in, 1<<20)
	w.Write(append(line, '\n'))
	for _, a := range arrays {
		w.Write(a.Data)
	}
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("jax %v: writing the request: %w", req["cmd"], err)
	}
	return readReply(j.out, req["cmd"], v)
}

// readReply reads one reply: a JSON line, then "nbytes" raw bytes if it says so.
func readReply(r *bufio.Reader, cmd any, v any) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("jax %v: no reply (did bench.py die? its errors are above): %w", cmd, err)
	}
	var head struct {
		Error  string `json:"error"`
		NBytes int    `json:"nbytes"`
	}
	if err := json.Unmarshal(line, &head); err != nil {
		return nil, fmt.Errorf("jax %v: bad reply %q: %w", cmd, line, err)
	}
	var payload []byte
	if head.NBytes > 0 {
		payload = make([]byte, head.NBytes)
		if _, err := io.ReadFull(r, payload); err != nil {
			return nil, fmt.Errorf("jax %v: reading %d bytes: %w", cmd, head.NBytes, err)
		}
	}
	if head.Error != "" {
		return nil, fmt.Errorf("jax: %s", head.Error)
	}
	if v != nil {
		if err := json.Unmarshal(line, v); err != nil {
			return nil, fmt.Errorf("jax %v: bad reply %q: %w", cmd, line, err)
		}
	}
	return payload, nil
}

// JAXInfo is bench.py's hello reply.
type JAXInfo struct {
	JAX      string   `json:"jax"`
	Optax    string   `json:"optax"`
	NumPy    string   `json:"numpy"`
	Devices  []string `json:"devices"`
	CPUCount int      `json:"cpu_count"`
	XLAFlags string   `json:"xla_flags"`
}

func (j *jaxProc) hello() (JAXInfo, error) {
	var info JAXInfo
	_, err := j.request(map[string]any{"cmd": "hello"}, nil, &info)
	return info, err
}

// setup builds case c on the JAX side under c.Name.
func (j *jaxProc) setup(c *Case) error {
	_, err := j.request(map[string]any{"cmd": "setup", "id": c.Name, "case": c.JAXCase, "cfg": c.Cfg}, c.Arrays, nil)
	return err
}

// check runs the JAX side's check of c (see Case.Check).
func (j *jaxProc) check(c *Case) (Result, error) {
	var rep struct {
		FirstMS float64   `json:"first_call_ms"`
		Losses  []float64 `json:"losses"`
	}
	payload, err := j.request(map[string]any{"cmd": "check", "id": c.Name, "steps": max(c.Steps, 1)}, nil, &rep)
	if err != nil {
		return Result{}, err
	}
	res := Result{FirstMS: rep.FirstMS, Losses: rep.Losses}
	if c.Steps == 0 {
		if len(payload)%4 != 0 {
			return res, fmt.Errorf("jax check %s: %d output bytes", c.Name, len(payload))
		}
		res.Out = make([]float32, len(payload)/4)
		for i := range res.Out {
			res.Out[i] = math.Float32frombits(binary.LittleEndian.Uint32(payload[4*i:]))
		}
	}
	return res, nil
}

// time runs n calls of c on the JAX side and returns the ns per call.
func (j *jaxProc) time(c *Case, n int) (float64, error) {
	var rep struct {
		NS float64 `json:"ns_per_call"`
	}
	_, err := j.request(map[string]any{"cmd": "time", "id": c.Name, "n": n}, nil, &rep)
	return rep.NS, err
}

func (j *jaxProc) drop(c *Case) error {
	_, err := j.request(map[string]any{"cmd": "drop", "id": c.Name}, nil, nil)
	return err
}

// close asks bench.py to quit and waits for it.
func (j *jaxProc) close() error {
	_, err := j.request(map[string]any{"cmd": "quit"}, nil, nil)
	j.in.Close()
	return errors.Join(err, j.cmd.Wait())
}

// agreement compares Ferry's check against JAX's: the largest relative
// difference (of the losses, or of the outputs relative to the largest
// output magnitude) and whether it is within c.Tol.
func agreement(c *Case, ferry, jax Result) (float64, bool, error) {
	if c.Steps > 0 {
		if len(ferry.Losses) != len(jax.Losses) || len(ferry.Losses) == 0 {
			return 0, false, fmt.Errorf("%s: %d Ferry losses, %d JAX losses", c.Name, len(ferry.Losses), len(jax.Losses))
		}
		worst := 0.0
		for i, l := range ferry.Losses {
			d := math.Abs(l-jax.Losses[i]) / math.Max(math.Abs(jax.Losses[i]), 1e-30)
			if math.IsNaN(d) {
				return d, false, nil
			}
			worst = math.Max(worst, d)
		}
		return worst, worst <= c.Tol, nil
	}
	if len(ferry.Out) != len(jax.Out) || len(ferry.Out) == 0 {
		return 0, false, fmt.Errorf("%s: %d Ferry outputs, %d JAX outputs", c.Name, len(ferry.Out), len(jax.Out))
	}
	scale, diff := 0.0, 0.0
	for i, v := range jax.Out {
		scale = math.Max(scale, math.Abs(float64(v)))
		d := math.Abs(float64(ferry.Out[i]) - float64(v))
		if math.IsNaN(d) {
			return d, false, nil
		}
		diff = math.Max(diff, d)
	}
	rel := diff / math.Max(scale, 1e-30)
	return rel, rel <= c.Tol, nil
}
