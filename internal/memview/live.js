  var PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];

  var app = document.getElementById('app');
  var bars = 0;
  if (data.pools.length === 0) el('p', {}, app, 'No pool holds memory.');
  data.pools.forEach(function (p) {
    el('h2', {}, app, p.platform + ':' + p.device + ' ' + p.space + ' (' + p.allocator + '): in use ' + fmt(p.bytes_in_use) +
      ', peak ' + fmt(p.peak_bytes_in_use) + ', reserved ' + fmt(p.reserved) + ', limit ' + (p.limit ? fmt(p.limit) : 'unlimited') +
      ', ' + p.live_allocs + ' live buffers');
    var free = p.free_bytes, largest = p.largest_free_block;
    el('p', {'class': 'note'}, app, 'free inside the reserved memory: ' + fmt(free) + ' in ' + p.free_blocks + ' blocks, largest ' +
      fmt(largest) + ', fragmentation ' + (100 * p.fragmentation).toFixed(1) + ' %' +
      (p.free_blocks > 1 ? ' (a request larger than ' + fmt(largest) + ' does not fit in the free blocks)' : ''));
    var segs = [];
    p.largest.forEach(function (b, i) {
      segs.push({bytes: b.bytes, color: PALETTE[i % PALETTE.length], text: fmt(b.bytes) + ' ' + b.type + (b.what && b.what !== 'array' ? ' (' + b.what + ')' : '') + '\nmade at ' + b.site + '\nage ' + b.age_secs.toFixed(1) + ' s'});
    });
    if (p.other_count > 0) segs.push({bytes: p.other_bytes, color: '#888', text: fmt(p.other_bytes) + ' in ' + p.other_count + ' smaller buffers'});
    if (largest > 0) segs.push({bytes: largest, color: '#fff', stroke: '#2a2', text: 'largest free block: ' + fmt(largest)});
    if (free > largest) segs.push({bytes: free - largest, color: '#fdd', stroke: '#c33', text: 'other free blocks: ' + fmt(free - largest) + ' in ' + (p.free_blocks - 1) + ' blocks (fragments)'});
    var used = 0;
    segs.forEach(function (s) { used += s.bytes; });
    var scale = Math.max(used, p.reserved, p.limit, 1);
    if (p.limit > used) segs.push({bytes: p.limit - Math.max(used, p.reserved), color: '#eee', text: 'not reserved, under the limit: ' + fmt(p.limit - Math.max(used, p.reserved))});
    var W = 860, H = 34;
    el('p', {'class': 'note'}, app, 'by size: the largest live buffers, largest first (hover for the Go line), the free memory inside the reserved memory (its largest block outlined green, the other blocks pink), the room left under the limit');
    var svg = svgEl('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H}, app);
    var x = 0;
    segs.forEach(function (s) {
      if (s.bytes <= 0) return;
      var w = s.bytes / scale * W;
      var r = svgEl('rect', {'class': 'bar', x: x, y: 2, width: Math.max(1, w), height: H - 4, fill: s.color, stroke: s.stroke || '#0003'}, svg);
      bars++;
      x += w;
      r.addEventListener('mousemove', function (ev) {
        tip.style.display = 'block';
        tip.style.left = (ev.clientX + 14) + 'px';
        tip.style.top = (ev.clientY + 10) + 'px';
        tip.textContent = s.text;
      });
      r.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    });
    if (p.map && p.map.length > 0) {
      // The address map: regions one after the other, each block where it is.
      var regions = {}, order = [], mapBytes = 0;
      p.map.forEach(function (b) {
        if (!(b.region in regions)) { regions[b.region] = 0; order.push(b.region); }
        regions[b.region] = Math.max(regions[b.region], b.offset + b.size);
      });
      var start = {};
      order.forEach(function (r) { start[r] = mapBytes; mapBytes += regions[r]; });
      el('p', {'class': 'note'}, app, 'address map of the reserved memory (' + order.length + ' region' + (order.length > 1 ? 's' : '') +
        ', ' + p.map.length + ' blocks' + (p.map_truncated ? ', the first shown' : '') + '): held blocks coloured by the Go line that made them, free blocks white, the largest outlined in green');
      var msvg = svgEl('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, 'class': 'map'}, app);
      var siteColour = {}, nsites = 0;
      var largestSeen = false;
      p.map.forEach(function (b) {
        var fill = '#fff', stroke = '#c33', text;
        if (b.free) {
          if (b.size === largest && !largestSeen) { stroke = '#2a2'; largestSeen = true; }
          text = 'free: ' + fmt(b.size) + ' at ' + fmt(b.offset) + ' of region ' + b.region;
        } else {
          var k = b.site || b.what || '?';
          if (!(k in siteColour)) siteColour[k] = PALETTE[nsites++ % PALETTE.length];
          fill = siteColour[k];
          stroke = '#0003';
          text = fmt(b.size) + ' ' + (b.what || '') + (b.site ? '\nmade at ' + b.site : '') + '\nat ' + fmt(b.offset) + ' of region ' + b.region;
        }
        var x0 = (start[b.region] + b.offset) / mapBytes * W;
        var r = svgEl('rect', {'class': 'bar', x: x0, y: 2, width: Math.max(0.5, b.size / mapBytes * W), height: H - 4, fill: fill, stroke: stroke}, msvg);
        bars++;
        r.addEventListener('mousemove', function (ev) {
          tip.style.display = 'block';
          tip.style.left = (ev.clientX + 14) + 'px';
          tip.style.top = (ev.clientY + 10) + 'px';
          tip.textContent = text;
        });
        r.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
      });
    }
    var t = el('table', {}, app);
    var h = el('tr', {}, t);
    ['bytes', 'array', 'made at', 'age'].forEach(function (c) { el('th', {}, h, c); });
    p.largest.forEach(function (b) {
      var tr = el('tr', {}, t);
      el('td', {}, tr, fmt(b.bytes));
      el('td', {}, tr, b.type + (b.what && b.what !== 'array' ? ' (' + b.what + ')' : ''));
      el('td', {}, tr, b.site);
      el('td', {}, tr, b.age_secs.toFixed(1) + ' s');
    });
    if (p.other_count > 0) {
      var tr = el('tr', {}, t);
      el('td', {}, tr, fmt(p.other_bytes));
      el('td', {}, tr, p.other_count + ' smaller buffers');
    }
  });
  document.body.setAttribute('data-bars', String(bars));
