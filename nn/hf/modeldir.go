package hf

import (
	"os"
	"path/filepath"

	"github.com/ferryml/ferry/internal/settings"
)

// ModelDir is where the Hugging Face model directory name (say
// "all-MiniLM-L6-v2") is looked for: under $FERRY_HF_MODELS, or
// ~/.cache/ferry-hf-models when that is unset (where .ci/hf.sh extracts the
// models it checks).
func ModelDir(name string) string {
	d := settings.HFModels.Get()
	if d == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = "."
		}
		d = filepath.Join(home, ".cache", "ferry-hf-models")
	}
	return filepath.Join(d, name)
}
