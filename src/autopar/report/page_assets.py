"""The style sheet and the small script of ``report.html`` (inline: the page must open with no
network and no file beside it).

The script does two things: a click on a column header sorts the ranking by that column
(numbers by the value in the cell's ``data-v``, the rest as text; a second click reverses), and
a click on a layout's row shows or hides the row beneath it with that layout's memory per stage
and pipeline timeline. A detail row moves with its layout when the table is sorted.
"""

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1200px;margin:1.5em auto;padding:0 1em;
color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.lead{color:#444;margin-top:0}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.5em .9em;min-width:9em}
.card b{display:block;font-size:1.25em}.card span{color:#666;font-size:.85em}
table{border-collapse:collapse;font-size:14px;width:100%}
th,td{padding:4px 8px;border-bottom:1px solid #e4e4e4;text-align:right;white-space:nowrap}
th{background:#f3f3f3;cursor:pointer;user-select:none;position:sticky;top:0}
th:hover{background:#e8e8e8}th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.l,th.l{text-align:left}
tr.row.has-detail{cursor:pointer}tr.row.has-detail:hover{background:#f5f8ff}
tr.row.open{background:#eaf0ff}
tr.row .toggle{color:#4c72b0;font-size:12px;display:inline-block;width:1.1em}
tr.detail>td{background:#fafafa;text-align:left;white-space:normal;padding:.8em}
.detail-grid{display:flex;flex-direction:column;gap:1em}
.detail-grid figure{margin:0}.detail-grid figure.memory img{max-width:560px}
.detail-grid figcaption{font-size:13px;color:#555;margin-bottom:.3em}
img{max-width:100%;height:auto}
.note{color:#555;font-size:13px}.hint{color:#555;font-size:13px;margin:.3em 0}
.marginal{color:#b8860b;font-weight:600}
"""

SCRIPT = """
(function () {
  var table = document.getElementById('ranking');
  if (!table) { return; }
  var body = table.tBodies[0];
  function key(row, col) {
    var cell = row.cells[col];
    var v = cell.getAttribute('data-v');
    return v === null ? cell.textContent.trim() : parseFloat(v);
  }
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
    th.addEventListener('click', function () {
      var descending = th.getAttribute('aria-sort') === 'ascending';
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', descending ? 'descending' : 'ascending');
      var rows = Array.prototype.slice.call(body.querySelectorAll('tr.row'));
      rows.sort(function (a, b) {
        var x = key(a, col), y = key(b, col);
        var order = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
        return descending ? -order : order;
      });
      rows.forEach(function (row) {
        var detail = document.getElementById(row.getAttribute('data-detail'));
        body.appendChild(row);
        if (detail) { body.appendChild(detail); }
      });
    });
  });
  Array.prototype.forEach.call(body.querySelectorAll('tr.row.has-detail'), function (row) {
    row.addEventListener('click', function () {
      var detail = document.getElementById(row.getAttribute('data-detail'));
      detail.hidden = !detail.hidden;
      row.classList.toggle('open', !detail.hidden);
      row.querySelector('.toggle').textContent = detail.hidden ? '\\u25B8' : '\\u25BE';
    });
  });
})();
"""
