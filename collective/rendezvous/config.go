package rendezvous

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/ferryml/ferry/internal/settings"
)

// The environment variables that describe a job without MPI (read by
// ConfigFromEnv, and by rt.InitDistributed outside mpirun).
const (
	// AddressEnv names the coordinator's address, host:port: process 0
	// listens on that port, the others connect to it.
	AddressEnv = "FERRY_COORDINATOR_ADDRESS"
	// NumProcessesEnv names the number of processes of the job.
	NumProcessesEnv = "FERRY_NUM_PROCESSES"
	// ProcessIDEnv names this process's id, 0 to count-1.
	ProcessIDEnv = "FERRY_PROCESS_ID"
)

// DefaultConnectTimeout bounds Join when Config.ConnectTimeout is 0.
const DefaultConnectTimeout = 5 * time.Minute

// MaxBytes bounds the bytes one rank sends in one Broadcast or AllGather:
// the rendezvous carries ids and small agreements, not arrays.
const MaxBytes = 64 << 10

// Config describes one process of a job (the arguments of
// jax.distributed.initialize).
type Config struct {
	// CoordinatorAddress is host:port of process 0, which runs the
	// coordinator: it listens on that port on every interface (on the
	// address itself when host is a loopback address), and the other
	// processes connect to it.
	CoordinatorAddress string
	// NumProcesses is the number of processes of the job, at least 1.
	NumProcesses int
	// ProcessID is this process's id, in [0, NumProcesses).
	ProcessID int
	// Job optionally names the job: the coordinator refuses processes
	// that name another one (with ErrJob), as it refuses processes that
	// were told another NumProcesses.
	Job string
	// ConnectTimeout bounds Join: how long a process keeps trying to
	// reach the coordinator and waits for every process to join.
	// 0 means DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// Listener, for process 0 only, is the listener the coordinator
	// accepts on, instead of one it opens on CoordinatorAddress's port
	// (for tests: a listener on 127.0.0.1:0 whose address the other
	// processes are given). Join owns it from then on.
	Listener net.Listener
}

// Errors wrapped by the errors of Join and of the communicators; test with
// errors.Is.
var (
	// ErrDataCollective: a collective that moves array data (AllReduce,
	// ReduceScatter, AllToAll, CollectivePermute, AllGather of a shaped
	// array, or a buffer over MaxBytes) on a rendezvous communicator.
	ErrDataCollective = errors.New("rendezvous: the TCP rendezvous carries only barriers and ids; collectives between processes on the CPU backend need MPI (launch under mpirun) or NCCL on GPUs")
	// ErrJob: the processes that reached the coordinator do not form one
	// job (another process count or job name, an id out of range or
	// claimed twice, another protocol version).
	ErrJob = errors.New("rendezvous: inconsistent job")
	// ErrTimeout: the coordinator could not be reached, the processes did
	// not all join within the connect timeout, or a collective waited
	// longer than FERRY_COLLECTIVE_TIMEOUT.
	ErrTimeout = errors.New("rendezvous: timed out")
	// ErrProcessLost: a process of the job died (its connection closed
	// without Close) or closed while the others still needed it.
	ErrProcessLost = errors.New("rendezvous: a process of the job is gone")
)

// ConfigFromEnv returns the Config described by FERRY_COORDINATOR_ADDRESS,
// FERRY_NUM_PROCESSES and FERRY_PROCESS_ID, and whether any of them is set.
// It is an error when some but not all are set or a number does not parse;
// the values themselves are checked by Join (see Config.Validate).
func ConfigFromEnv() (cfg Config, ok bool, err error) {
	addr, hasAddr := settings.CoordinatorAddress.Raw()
	_, hasCount := settings.NumProcesses.Raw()
	_, hasID := settings.ProcessID.Raw()
	if !hasAddr && !hasCount && !hasID {
		return Config{}, false, nil
	}
	var missing []string
	for _, v := range []struct {
		name string
		set  bool
	}{{AddressEnv, hasAddr}, {NumProcessesEnv, hasCount}, {ProcessIDEnv, hasID}} {
		if !v.set {
			missing = append(missing, v.name)
		}
	}
	if len(missing) > 0 {
		return Config{}, true, fmt.Errorf("rendezvous: %s must be set together; %s is not set", strings.Join([]string{AddressEnv, NumProcessesEnv, ProcessIDEnv}, ", "), strings.Join(missing, " and "))
	}
	cfg.CoordinatorAddress = addr
	count, _, err := settings.NumProcesses.Lookup()
	if err != nil {
		return Config{}, true, fmt.Errorf("rendezvous: %w", err)
	}
	id, _, err := settings.ProcessID.Lookup()
	if err != nil {
		return Config{}, true, fmt.Errorf("rendezvous: %w", err)
	}
	cfg.NumProcesses, cfg.ProcessID = int(count), int(id)
	return cfg, true, nil
}

// Validate checks the process count, the id and the address.
func (c *Config) Validate() error {
	switch {
	case c.NumProcesses < 1:
		return fmt.Errorf("rendezvous: the job has %d processes, want at least 1 (%s)", c.NumProcesses, NumProcessesEnv)
	case c.ProcessID < 0 || c.ProcessID >= c.NumProcesses:
		return fmt.Errorf("rendezvous: process id %d is out of range for a job of %d processes, want 0 to %d (%s)", c.ProcessID, c.NumProcesses, c.NumProcesses-1, ProcessIDEnv)
	case c.ConnectTimeout < 0:
		return fmt.Errorf("rendezvous: negative connect timeout %v", c.ConnectTimeout)
	case c.Listener != nil && c.ProcessID != 0:
		return fmt.Errorf("rendezvous: process %d was given a listener; only process 0 runs the coordinator", c.ProcessID)
	}
	if c.Listener != nil && c.CoordinatorAddress == "" {
		return nil // process 0 alone needs no address when it has its listener
	}
	_, port, err := splitAddress(c.CoordinatorAddress)
	if err != nil {
		return err
	}
	if port == 0 && c.Listener == nil && c.NumProcesses > 1 {
		return fmt.Errorf("rendezvous: coordinator address %q has port 0: the other processes could not find it; name a port (%s)", c.CoordinatorAddress, AddressEnv)
	}
	return nil
}

// splitAddress checks a host:port address and returns its parts.
func splitAddress(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("rendezvous: coordinator address %q: want host:port such as node0:29500 (%s): %v", addr, AddressEnv, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("rendezvous: coordinator address %q: port %q is not a number from 0 to 65535 (%s)", addr, p, AddressEnv)
	}
	if host == "" {
		return "", 0, fmt.Errorf("rendezvous: coordinator address %q has no host: name process 0's machine, such as node0:%d (%s)", addr, port, AddressEnv)
	}
	return host, port, nil
}

// listenAddress is where process 0 listens for addr: every interface at
// its port, so that a host name that resolves to a loopback alias (Debian
// maps the machine's own name to 127.0.1.1) still lets other machines in,
// unless host is a loopback address or localhost, which stays local.
func listenAddress(addr string) (string, error) {
	host, port, err := splitAddress(addr)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return addr, nil
	}
	return net.JoinHostPort("", strconv.Itoa(port)), nil
}
