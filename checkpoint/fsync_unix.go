//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// canLock tells whether files can be locked (flock) here, so that stale
// temporary files can be told from live ones.
const canLock = true

// lockFile locks f exclusively for as long as it is open.
func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}

// tryLock reports whether f could be locked: no open file holds it locked.
func tryLock(f *os.File) bool { return lockFile(f) == nil }

// syncDir syncs the directory dir, so that a rename or creation in it is
// on storage. File systems that cannot sync a directory are let be.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	d.Close()
	if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		return fmt.Errorf("syncing the directory %s: %w", dir, err)
	}
	return nil
}
