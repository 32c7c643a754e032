package memview

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"html"
	"io"
)

// DataID is the id of the <script type="application/json"> block that holds
// a page's data.
const DataID = "ferry-memory-data"

//go:embed page.css
var pageCSS string

//go:embed common.js
var commonJS string

//go:embed program.js
var programJS string

//go:embed live.js
var liveJS string

// WriteProgramPage writes the page of p (and of p.Baseline beside it, on
// demand: a button, or #baseline in the page's address, shows it). Its
// title names each program with its budget (Program.Title). When a
// program was compiled under a memory budget (Program.Budget), its device
// chart draws the budget as a line and the page has a section with the
// plan's decisions, as a table with totals; in a comparison, each
// program's section follows the other's.
func WriteProgramPage(w io.Writer, p *Program) error {
	title := "Ferry memory: " + p.title()
	if p.Baseline != nil {
		title += ", beside " + p.Baseline.title()
	}
	var plan bytes.Buffer
	if p.Budget != nil || p.Baseline != nil && p.Baseline.Budget != nil {
		writeBudgetSection(&plan, p, "program")
		if p.Baseline != nil {
			writeBudgetSection(&plan, p.Baseline, "baseline")
		}
	}
	return writePage(w, title, p, programJS, plan.String())
}

// WriteLivePage writes the page of the live pools.
func WriteLivePage(w io.Writer, l *Live) error {
	return writePage(w, "Ferry live memory", l, liveJS, "")
}

// writePage writes a self-contained page: the style, the data as JSON, the
// script that draws it and after the drawing extra (HTML), nothing loaded
// from elsewhere. The page sets data-bars on <body> to the number of bars
// it drew and data-errors to the number of script errors (their messages
// go to #ferry-errors).
func writePage(w io.Writer, title string, data any, script, extra string) error {
	js, err := json.Marshal(data) // escapes <, > and &: safe inside <script>
	if err != nil {
		return fmt.Errorf("memview: %w", err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%s</title>
<style>%s</style>
<script>window.ferryErrors=[];window.addEventListener('error',function(e){window.ferryErrors.push(String(e.message));var b=document.body;if(b){b.setAttribute('data-errors',String(window.ferryErrors.length));var p=document.getElementById('ferry-errors');if(p){p.textContent=window.ferryErrors.join('\n');}}});</script>
</head><body data-bars="-1" data-errors="0">
<h1>%s</h1>
<pre id="ferry-errors"></pre>
<div id="app"></div>
%s<div id="tip" class="tip"></div>
<script type="application/json" id="%s">%s</script>
<script>(function () {
'use strict';
%s%s})();</script>
</body></html>
`, html.EscapeString(title), pageCSS, html.EscapeString(title), extra, DataID, js, commonJS, script)
	_, err = w.Write(b.Bytes())
	return err
}
