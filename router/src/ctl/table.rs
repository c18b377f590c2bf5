//! Plain-text tables: a header row and left-aligned columns two spaces apart.

/// A table being filled.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column headers.
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are blank, extra ones dropped).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The laid-out text.
    pub fn render(&self) -> String {
        let n = self.headers.len();
        let cell = |row: &[String], i: usize| row.get(i).map_or("", String::as_str).to_owned();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, w) in widths.iter_mut().enumerate() {
                *w = (*w).max(cell(r, i).chars().count());
            }
        }
        let line = |cells: Vec<String>| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                s.push_str(c);
                if i + 1 < n {
                    let pad = widths[i] + 2 - c.chars().count();
                    s.push_str(&" ".repeat(pad));
                }
            }
            s.trim_end().to_owned() + "\n"
        };
        let mut out = line(self.headers.iter().map(|h| (*h).to_owned()).collect());
        for r in &self.rows {
            out.push_str(&line((0..n).map(|i| cell(r, i)).collect()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_the_widest_cell() {
        let mut t = Table::new(&["NAME", "ROLE"]);
        t.row(vec!["decode-0".into(), "decode".into()]);
        t.row(vec!["p".into()]);
        assert_eq!(t.render(), "NAME      ROLE\ndecode-0  decode\np\n");
    }
}
