// The helpers both pages' scripts share; writePage puts this file and the
// page's script inside one strict-mode function.
  var data = JSON.parse(document.getElementById('ferry-memory-data').textContent);
  var NS = 'http://www.w3.org/2000/svg';
  var tip = document.getElementById('tip');

  function fmt(n) {
    var a = Math.abs(n);
    if (a >= 1 << 30) return (n / (1 << 30)).toFixed(2) + ' GiB';
    if (a >= 1 << 20) return (n / (1 << 20)).toFixed(2) + ' MiB';
    if (a >= 1 << 10) return (n / (1 << 10)).toFixed(2) + ' KiB';
    return n + ' B';
  }
  function el(tag, attrs, parent, text) {
    var e = document.createElement(tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function svgEl(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
