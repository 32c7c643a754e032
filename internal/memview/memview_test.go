package memview

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ferryml/ferry/passes"
)

// TestBuildNoPlan: a program without a buffer plan is an error naming it.
func TestBuildNoPlan(t *testing.T) {
	for _, p := range []*passes.Program{nil, {}} {
		if _, err := Build(p); err == nil || !strings.Contains(err.Error(), "no buffer plan") {
			t.Errorf("Build(%v): %v", p, err)
		}
	}
}

// TestPageSelfContained: a page loads nothing from elsewhere and its data
// cannot close its script block.
func TestPageSelfContained(t *testing.T) {
	var b bytes.Buffer
	p := &Program{Name: `</script><script src="x.js">`, Steps: []Step{}, Spaces: []Space{}}
	if err := WriteProgramPage(&b, p); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if strings.Contains(strings.ReplaceAll(page, "http://www.w3.org/2000/svg", ""), "http") {
		t.Errorf("the page has an address")
	}
	for _, bad := range []string{"<script src", "<link", "@import", "url("} {
		if strings.Contains(page, bad) {
			t.Errorf("the page has %q", bad)
		}
	}
	if n := strings.Count(page, "</script>"); n != 3 {
		t.Errorf("%d </script>, want 3", n)
	}
}
