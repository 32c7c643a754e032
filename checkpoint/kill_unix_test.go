//go:build unix

package checkpoint_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// TestFileModes: files are created 0644 less the umask, or as WithFileMode
// says.
func TestFileModes(t *testing.T) {
	if inJob {
		t.Skip("one process")
	}
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	tree := place(t, randomLiterals(5), unsharded, unspecs)
	dir := t.TempDir()
	mode := func(name string) os.FileMode {
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		return st.Mode().Perm()
	}
	require.NoError(t, checkpoint.SaveFile(filepath.Join(dir, "a"), tree, nil))
	require.Equal(t, os.FileMode(0o644), mode("a"))
	require.NoError(t, checkpoint.SaveFile(filepath.Join(dir, "b"), tree, nil, checkpoint.WithFileMode(0o600)))
	require.Equal(t, os.FileMode(0o600), mode("b"))
	require.NoError(t, checkpoint.SaveSharded(filepath.Join(dir, "s"), tree, nil))
	require.Equal(t, os.FileMode(0o644), mode("s/index.json"))
	require.Equal(t, os.FileMode(0o644), mode("s/process-0-of-1.save1.safetensors"))
	syscall.Umask(0o077)
	require.NoError(t, checkpoint.SaveFile(filepath.Join(dir, "c"), tree, nil))
	require.Equal(t, os.FileMode(0o600), mode("c"))
}

// killEnv makes TestKilledSave the process it launches: a save killed
// (SIGKILL) at its Nth step. Its value is "kind:N:dir:seed".
const killEnv = "FERRY_CKPT_KILL"

// killLayout is the sharded layout of the killed saves.
func killLayout(t *testing.T) ([]*ir.Mesh, []ir.PartitionSpec) {
	m24 := mesh(t, []int{2, 4}, []string{"x", "y"})
	m8 := mesh(t, []int{8}, []string{"x"})
	return []*ir.Mesh{m24, m8, m24, m24, nil, m24, nil},
		[]ir.PartitionSpec{ir.P("x", "y"), ir.P("x"), ir.P("y"), ir.P(), nil, ir.P("", "x"), nil}
}

// stepValues are the values of save step s of a killed-save run.
func stepValues(seed uint64, s int) []*ir.Literal { return randomLiterals(seed + uint64(s)) }

// saveStep saves step s (values and metadata "step") as kind says.
func saveStep(t *testing.T, kind, dir string, seed uint64, s int) error {
	meshes, specs := killLayout(t)
	meta := map[string]string{"step": strconv.Itoa(s)}
	if kind == "file" {
		return checkpoint.SaveFile(filepath.Join(dir, "ck.safetensors"), place(t, stepValues(seed, s), unsharded, unspecs), meta)
	}
	return checkpoint.SaveSharded(dir, place(t, stepValues(seed, s), meshes, specs), meta)
}

// loadStep loads dir and tells which step's values it holds (0: none of
// 1..3), and the step its metadata says.
func loadStep(t *testing.T, kind, dir string, seed uint64) (values int, meta string, err error) {
	like := place(t, zeros(), unsharded, unspecs)
	var got ckTree
	if kind == "file" {
		path := filepath.Join(dir, "ck.safetensors")
		if got, err = checkpoint.LoadFile(path, like); err != nil {
			return 0, "", err
		}
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		_, m, err := checkpoint.ReadHeader(f)
		require.NoError(t, err)
		meta = m["step"]
	} else {
		if got, err = checkpoint.LoadSharded(dir, like); err != nil {
			return 0, "", err
		}
		idx, err := checkpoint.ReadIndex(dir)
		require.NoError(t, err)
		meta = idx.Metadata["step"]
	}
	ls := make([][]byte, 7)
	for i, x := range got.leaves() {
		l, err := x.Literal()
		require.NoError(t, err)
		ls[i] = l.Data
		require.NoError(t, x.Delete())
	}
	for s := 1; s <= 3; s++ {
		same := true
		for i, w := range stepValues(seed, s) {
			same = same && bytes.Equal(ls[i], w.Data)
		}
		if same {
			return s, meta, nil
		}
	}
	return 0, meta, nil
}

// killedSave is the process TestKilledSave launches: it saves step 2 and
// kills itself at the Nth step of writing.
func killedSave(t *testing.T, v string) {
	parts := strings.Split(v, ":")
	require.Len(t, parts, 4)
	n, err := strconv.Atoi(parts[1])
	require.NoError(t, err)
	seed, err := strconv.ParseUint(parts[3], 10, 64)
	require.NoError(t, err)
	count := 0
	checkpoint.SetStepHook(func(step string) {
		if count++; count == n { // n = 0 when strace kills the process
			fmt.Printf("killed at %q\n", step)
			p, _ := os.FindProcess(os.Getpid())
			_ = p.Kill()
			select {}
		}
	})
	require.NoError(t, saveStep(t, parts[0], parts[2], seed, 2))
	fmt.Println("save completed")
}

// TestKilledSave kills (SIGKILL) a save of step 2 over a checkpoint of
// step 1 at each of its steps (files created, written, synced, renamed,
// directory synced, earlier files removed), in a process of its own: the
// directory then loads step 1 or step 2, its values and metadata alike,
// never a mix; step 2 once the save committed; the load removes the
// temporary file the save left, and the next save leaves only its own
// files. Where strace runs, the same again with the process killed by
// strace at its Nth rename system call instead.
func TestKilledSave(t *testing.T) {
	if v := settings.CkptKill.Get(); v != "" {
		killedSave(t, v)
		return
	}
	if inJob {
		t.Skip("one process")
	}
	seed := testSeed(t)
	strace := exec.Command("strace", "-f", "-qq", "-o", "/dev/null", "true").Run() == nil
	for _, kind := range []string{"file", "sharded", "file/strace", "sharded/strace"} {
		t.Run(kind, func(t *testing.T) {
			kind, byStrace := strings.CutSuffix(kind, "/strace")
			if byStrace && !strace {
				t.Skip("strace cannot run here")
			}
			committed := false
			for n := 1; ; n++ {
				require.Less(t, n, 40, "the save never completed")
				dir := t.TempDir()
				require.NoError(t, saveStep(t, kind, dir, seed, 1))
				args := []string{os.Args[0], "-test.run=^TestKilledSave$", "-test.count=1", "-test.v"}
				hookAt := n
				if byStrace {
					hookAt = 0
					args = append([]string{"strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=rename,renameat,renameat2",
						"-e", fmt.Sprintf("inject=rename,renameat,renameat2:signal=SIGKILL:when=%d", n)}, args...)
				}
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d:%s:%d", killEnv, kind, hookAt, dir, seed))
				out, err := cmd.CombinedOutput()
				completed := err == nil && strings.Contains(string(out), "save completed")
				where := "completed"
				if !completed {
					var ee *exec.ExitError
					require.ErrorAs(t, err, &ee, "%s", out)
					ws, ok := ee.Sys().(syscall.WaitStatus)
					require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "not killed: %v\n%s", err, out)
					if byStrace {
						where = fmt.Sprintf("killed at rename %d", n)
					} else {
						i := strings.Index(string(out), "killed at ")
						require.GreaterOrEqual(t, i, 0, "%s", out)
						where = strings.SplitN(string(out[i:]), "\n", 2)[0]
					}
				}
				left := len(tempFiles(t, dir))
				values, meta, err := loadStep(t, kind, dir, seed)
				require.NoError(t, err, "after the save was %s", where)
				require.Contains(t, []int{1, 2}, values, "after the save was %s: loaded values of no save", where)
				require.Equal(t, strconv.Itoa(values), meta, "after the save was %s: values of step %d with metadata of step %s", where, values, meta)
				require.False(t, committed && values == 1, "after the save was %s: step 1 loaded after an earlier kill point loaded step 2", where)
				committed = values == 2
				require.Empty(t, tempFiles(t, dir), "the load left the temporary files")
				t.Logf("kill point %d, %s: loaded step %d (%d temporary files left by the save)", n, where, values, left)

				// The next save leaves only its own files.
				require.NoError(t, saveStep(t, kind, dir, seed, 3))
				entries, err := os.ReadDir(dir)
				require.NoError(t, err)
				var names []string
				for _, e := range entries {
					names = append(names, e.Name())
				}
				want := []string{"ck.safetensors"}
				if kind == "sharded" {
					idx, err := checkpoint.ReadIndex(dir)
					require.NoError(t, err)
					want = []string{checkpoint.IndexFile, idx.Files[0].Name}
				}
				require.ElementsMatch(t, want, names)
				values, _, err = loadStep(t, kind, dir, seed)
				require.NoError(t, err)
				require.Equal(t, 3, values)
				if completed {
					require.True(t, committed)
					return
				}
			}
		})
	}
}
