package settings

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// The markers around the generated table in docs/settings.md.
const (
	BeginMarker = "<!-- BEGIN settings table: generated from internal/settings by `go generate ./internal/settings`; do not edit -->"
	EndMarker   = "<!-- END settings table -->"
)

// GenerateCommand is the command that regenerates docs/settings.md.
const GenerateCommand = "go generate ./internal/settings"

// Markdown returns the table as a Markdown table: Variable, Type, Default,
// Meaning and Read by, one row per variable sorted by name.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| Variable | Type | Default | Meaning | Read by |\n")
	b.WriteString("| --- | --- | --- | --- | --- |\n")
	for _, v := range All() {
		doc := v.Doc
		switch v.Scope {
		case Test:
			doc = "*tests*: " + doc
		case Internal:
			doc = "*internal*: " + doc
		}
		readers := make([]string, len(v.Readers))
		for i, r := range v.Readers {
			readers[i] = "`" + r + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", v.Name, cell(v.Type), cell(v.Default), cell(doc), strings.Join(readers, ", "))
	}
	return b.String()
}

// cell escapes the pipes of a table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// UpdateDoc returns page with the text between BeginMarker and EndMarker
// replaced by Markdown.
func UpdateDoc(page []byte) ([]byte, error) {
	i := bytes.Index(page, []byte(BeginMarker))
	j := bytes.Index(page, []byte(EndMarker))
	if i < 0 || j < i {
		return nil, errors.New("settings: the page has no " + BeginMarker + " … " + EndMarker + " section")
	}
	var out bytes.Buffer
	out.Write(page[:i+len(BeginMarker)])
	out.WriteString("\n\n")
	out.WriteString(Markdown())
	out.WriteString("\n")
	out.Write(page[j:])
	return out.Bytes(), nil
}
