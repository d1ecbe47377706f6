// What the pages share: number formatting and filling a table's body.
"use strict";

function fmt(x, digits = 1) {
  if (x === null || x === undefined) return "–";
  if (Math.abs(x) >= 1000) return Math.round(x).toLocaleString("en");
  return Number.isInteger(x) ? String(x) : x.toFixed(digits);
}

function setText(id, text) { document.getElementById(id).textContent = text; }

// rows -> <tbody> of table `id`: cells(row) gives [text, class?] per cell; `empty` when no row
function fill(id, rows, cells, empty) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) {
    const td = body.insertRow().insertCell();
    td.colSpan = document.querySelector(`#${id} thead tr`).cells.length;
    td.className = "empty";
    td.textContent = empty;
    return;
  }
  for (const row of rows) {
    const tr = body.insertRow();
    for (const [text, cls] of cells(row)) {
      const td = tr.insertCell();
      td.textContent = text;
      if (cls) td.className = cls;
    }
  }
}
