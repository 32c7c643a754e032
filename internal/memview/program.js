  var COLORS = {argument: '#4e79a7', output: '#59a14f', temp: '#f28e2b', donated: '#b07aa1', offloaded: '#e15759', prefetched: '#17becf'};

  function stepText(prog, k) {
    var s = prog.steps[k];
    if (!s) return 'step ' + k;
    return 'step ' + k + ': ' + s.op + (s.loc ? ' at ' + s.loc : '') + (s.iter ? ', ' + s.iter : '') + '\nin ' + s.path;
  }
  function describe(prog, b, sp) {
    return b.value + ' ' + b.type + ' (' + fmt(b.bytes) + ')\n' +
      'dtype ' + b.dtype + ', shape [' + b.shape.join(', ') + ']\n' +
      'kind: ' + b.kind + (b.double_buffered ? ' (double buffered)' : '') + ', plan: ' + b.plan + '\n' +
      'made by: ' + b.op + (b.loc ? ' at ' + b.loc : '') + '\n' +
      'first use: ' + b.first_use + '\nlast use: ' + b.last_use + '\n' +
      (sp ? 'bar: steps ' + sp.start + '–' + sp.end + ' at ' + fmt(sp.y) + (sp.reserved >= 0 ? ', reserved after step ' + sp.reserved : '') + '\n' : '') +
      (b.of ? 'slice of ' + b.of + '\n' : '') + 'region: ' + b.region;
  }

  // budgetOf returns the budget to draw on prog's chart of space: prog's
  // own, or beside a budgeted program the other's (marked so); else null.
  function budgetOf(prog, space) {
    if (space.space !== 'device') return null;
    if (prog.budget) return {bytes: prog.budget.bytes, text: 'budget ' + prog.budget.label, own: true};
    var other = shown.filter(function (p) { return p !== prog && p.budget; })[0];
    if (other) return {bytes: other.budget.bytes, text: 'the program\'s budget ' + other.budget.label, own: false};
    return null;
  }

  function chart(prog, space, parent, details, W) {
    var H = 300, L = 62, R = 8, T = 18, B = 26;
    var n = Math.max(1, prog.steps.length);
    var budget = budgetOf(prog, space);
    var total = Math.max(1, space.total_bytes, space.peak_bytes, scale[space.space] || 0);
    var sx = (W - L - R) / n, sy = (H - T - B) / total;
    var svg = svgEl('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, 'data-space': space.space}, parent);
    if (budget) svg.setAttribute('data-budget', String(budget.bytes));
    // Axes: bytes on the left, steps below.
    for (var i = 0; i <= 4; i++) {
      var v = total * i / 4, y = H - B - v * sy;
      svgEl('line', {x1: L, x2: W - R, y1: y, y2: y, stroke: '#e4e4e4'}, svg);
      svgEl('text', {x: L - 4, y: y + 3, 'text-anchor': 'end'}, svg, fmt(v));
    }
    var every = Math.max(1, Math.ceil(n / 12));
    for (var k = 0; k < n; k += every) {
      svgEl('text', {x: L + (k + 0.5) * sx, y: H - B + 12, 'text-anchor': 'middle'}, svg, String(k));
    }
    svgEl('text', {x: W - R, y: H - 3, 'text-anchor': 'end'}, svg, 'step');
    if (space.arena_base > 0 && space.temp_bytes > 0) {
      var ya = H - B - space.arena_base * sy;
      svgEl('line', {x1: L, x2: W - R, y1: ya, y2: ya, stroke: '#999', 'stroke-dasharray': '2,3'}, svg);
      svgEl('text', {x: W - R - 2, y: ya - 2, 'text-anchor': 'end'}, svg, 'arena');
    }
    var parents = {};
    space.buffers.forEach(function (b) { if (b.of) parents[b.of] = true; });
    var order = space.buffers.map(function (b, i) { return i; });
    order.sort(function (a, c) { return (space.buffers[a].of ? 1 : 0) - (space.buffers[c].of ? 1 : 0); });
    var bars = 0;
    order.forEach(function (bi) {
      var b = space.buffers[bi];
      b.spans.forEach(function (sp) {
        var end = sp.reserved >= 0 ? sp.reserved : sp.end;
        var cls = 'bar' + (parents[b.id] ? ' stacked' : '');
        var r = svgEl('rect', {
          'class': cls, x: L + sp.start * sx, y: H - B - (sp.y + b.bytes) * sy,
          width: Math.max(1, (end - sp.start + 1) * sx), height: Math.max(1, b.bytes * sy),
          fill: COLORS[b.kind] || '#888'
        }, svg);
        bars++;
        if (sp.reserved >= 0 && sp.end > sp.reserved) {
          svgEl('rect', {'class': 'reserved', x: L + (sp.reserved + 1) * sx, y: H - B - (sp.y + b.bytes) * sy,
            width: (sp.end - sp.reserved) * sx, height: Math.max(1, b.bytes * sy), fill: COLORS[b.kind]}, svg);
        }
        r.addEventListener('mousemove', function (ev) {
          tip.style.display = 'block';
          tip.style.left = (ev.clientX + 14) + 'px';
          tip.style.top = (ev.clientY + 10) + 'px';
          tip.textContent = describe(prog, b, sp);
        });
        r.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
        r.addEventListener('click', function () {
          var old = document.querySelector('rect.sel');
          if (old) old.classList.remove('sel');
          r.classList.add('sel');
          details.textContent = describe(prog, b, sp);
        });
      });
    });
    // The bytes in use per step, and the peak.
    var pts = space.live.map(function (v, k) { return (L + (k + 0.5) * sx) + ',' + (H - B - v * sy); }).join(' ');
    svgEl('polyline', {points: pts, fill: 'none', stroke: '#000', 'stroke-width': 1, 'stroke-opacity': 0.6}, svg);
    var px = L + (space.peak_step + 0.5) * sx;
    svgEl('line', {x1: px, x2: px, y1: T - 4, y2: H - B, stroke: '#c00', 'stroke-dasharray': '4,2'}, svg);
    svgEl('text', {x: Math.min(px + 3, W - 190), y: T - 6 + 10, fill: '#c00'}, svg,
      'peak ' + fmt(space.peak_bytes) + ' at step ' + space.peak_step);
    // The memory budget: what the plan's total must fit.
    if (budget) {
      var yb = H - B - budget.bytes * sy, col = budget.own ? '#6a3d9a' : '#9e86b8';
      svgEl('line', {'class': 'budget', x1: L, x2: W - R, y1: yb, y2: yb, stroke: col, 'stroke-width': budget.own ? 2 : 1.5,
        'stroke-dasharray': budget.own ? '8,3' : '3,3'}, svg);
      svgEl('text', {'class': 'budget', x: L + 4, y: yb - 3, fill: col, 'font-weight': 'bold'}, svg, budget.text);
    }
    svg.addEventListener('click', function (ev) {
      if (ev.target.tagName !== 'rect') {
        var box = svg.getBoundingClientRect();
        var k = Math.floor((ev.clientX - box.left - L) / sx);
        if (k >= 0 && k < n) details.textContent = stepText(prog, k) + '\nin use: ' + fmt(space.live[k]);
      }
    });
    return bars;
  }

  function analysisTable(progs, parent) {
    var t = el('table', {}, parent);
    var head = el('tr', {}, t);
    el('th', {}, head, '');
    // The columns' titles are above the charts: here their roles.
    progs.forEach(function (p) { el('th', {title: p.title || p.name}, head, p === data ? 'program' : 'baseline'); });
    var br = el('tr', {'class': 'budget'}, t);
    el('td', {}, br, 'memory budget');
    progs.forEach(function (p) { el('td', {}, br, p.budget ? p.budget.label : 'none'); });
    var rows = [['device argument', 'argument_bytes'], ['device output', 'output_bytes'], ['device alias', 'alias_bytes'],
      ['device temp', 'temp_bytes'], ['device total', 'total_bytes'], ['host argument', 'host_argument_bytes'],
      ['host output', 'host_output_bytes'], ['host alias', 'host_alias_bytes'], ['host temp', 'host_temp_bytes'], ['host total', 'host_total_bytes']];
    rows.forEach(function (r) {
      var tr = el('tr', {}, t);
      el('td', {}, tr, r[0]);
      progs.forEach(function (p) { el('td', {}, tr, fmt(p.analysis[r[1]])); });
    });
    ['device', 'pinned_host'].forEach(function (s) {
      var tr = el('tr', {}, t);
      el('td', {}, tr, s + ' peak in use');
      progs.forEach(function (p) {
        var sp = p.spaces.filter(function (x) { return x.space === s; })[0];
        el('td', {}, tr, sp ? fmt(sp.peak_bytes) + ' @' + sp.peak_step : '–');
      });
    });
    var tr = el('tr', {}, t);
    el('td', {}, tr, 'steps');
    progs.forEach(function (p) { el('td', {}, tr, String(p.steps.length)); });
  }

  function column(prog, parent, label, details, W) {
    var col = el('div', {'class': 'col', 'data-program': label, style: 'width:' + (W + 4) + 'px'}, parent);
    el('h2', {}, col, label + ': ' + (prog.title || prog.name));
    var bars = 0;
    prog.spaces.forEach(function (s) {
      var budget = s.space === 'device' && prog.budget ? ' of a ' + prog.budget.label + ' budget' : '';
      el('h3', {}, col, s.space + ': ' + fmt(s.total_bytes) + ' planned' + budget + ' (argument ' + fmt(s.argument_bytes) + ', output ' +
        fmt(s.output_bytes) + ', alias ' + fmt(s.alias_bytes) + ', temp ' + fmt(s.temp_bytes) + '), peak in use ' + fmt(s.peak_bytes) +
        ' at step ' + s.peak_step + ', ' + s.buffers.length + ' buffers');
      bars += chart(prog, s, col, details, W);
    });
    return {el: col, bars: bars};
  }

  var app = document.getElementById('app');
  var legend = el('div', {'class': 'legend'}, app);
  Object.keys(COLORS).forEach(function (k) {
    var s = el('span', {}, legend);
    el('i', {style: 'background:' + COLORS[k]}, s);
    s.appendChild(document.createTextNode(k));
  });
  el('span', {'class': 'note'}, legend, 'x: step of the compiled program (scan bodies per iteration); y: byte address (arguments, outputs, then the arena); black line: bytes in use. Hover or click a bar.');
  if (data.budget || data.baseline && data.baseline.budget) el('a', {href: '#plan-program'}, legend, 'memory budget plan ↓');
  var row = el('div', {'class': 'row'}, app);
  var main = el('div', {'class': 'cols'}, row);
  var side = el('div', {'class': 'side'}, row);
  el('h2', {}, side, 'Memory analysis');
  var tableBox = el('div', {}, side);
  el('h2', {}, side, 'Selected');
  var details = el('div', {id: 'details'}, side, 'Click a bar or a step.');
  var mine = null, base = null;
  var scale = {}; // bytes of the y axis per space: the same for both programs
  var shown = []; // the programs drawn
  // render draws the program, and the baseline before it when on.
  function render(on) {
    main.textContent = '';
    var cols = on ? 2 : 1;
    var W = Math.max(420, Math.min(900, Math.floor((window.innerWidth - 380) / cols) - 20));
    scale = {};
    shown = on ? [data, data.baseline] : [data];
    shown.forEach(function (p) {
      p.spaces.forEach(function (s) { scale[s.space] = Math.max(scale[s.space] || 0, s.total_bytes, s.peak_bytes); });
      // Room above a budget line for its label.
      if (p.budget) scale.device = Math.max(scale.device || 0, p.budget.bytes * 1.12);
    });
    base = on ? column(data.baseline, main, 'baseline', details, W) : null;
    mine = column(data, main, 'program', details, W);
    tableBox.textContent = '';
    analysisTable(on ? [data.baseline, data] : [data], tableBox);
    var n = mine.bars + (base ? base.bars : 0);
    document.body.setAttribute('data-bars', String(n));
    document.body.setAttribute('data-bars-program', String(mine.bars));
    document.body.setAttribute('data-bars-baseline', String(base ? base.bars : 0));
  }
  if (data.baseline) {
    var btn = el('button', {id: 'toggle-baseline'}, legend, 'show baseline beside');
    btn.addEventListener('click', function () {
      var on = !base;
      btn.textContent = on ? 'hide baseline' : 'show baseline beside';
      render(on);
    });
    render(location.hash === '#baseline');
    if (base) btn.textContent = 'hide baseline';
  } else {
    render(false);
  }
