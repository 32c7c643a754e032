package hf_test

import (
	"fmt"
	"path/filepath"

	"github.com/ferryml/ferry/nn/hf"
)

// Programs find a pretrained model's files under $FERRY_HF_MODELS (by
// default ~/.cache/ferry-hf-models).
func ExampleModelDir() {
	dir := hf.ModelDir("all-MiniLM-L6-v2")
	fmt.Println(filepath.Base(dir))
	// Output:
	// all-MiniLM-L6-v2
}
