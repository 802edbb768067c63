//! The bound on how deep a Rust file nests, checked on its tokens before syn parses it: syn
//! recurses as deep as the code does, and a stack overflow would end the whole runner, not only
//! the review of one submission.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// How deep groups (`()`, `[]`, `{}`) may nest, and how long a chain of tokens the parser may
/// have to descend through (`shape`): over ten times what the workspace and the large crates it
/// uses reach (11 and about 500).
pub(super) const MAX_DEPTH: usize = 128;
pub(super) const MAX_CHAIN: usize = 1500;

/// Bounds the parser's recursion before it runs: groups nest at most `MAX_DEPTH` deep, and no
/// token sits deeper than `MAX_CHAIN` in a chain the parser may descend through (`!!!!x`,
/// `a = b = c`, `|x| |y|`, `fn() -> fn() ->`, `V<V<…>>`, `else if` chains), counted through the
/// enclosing groups. A chain ends at a `;` or a block ending a statement; a `,` goes back to where
/// the innermost open `<` began (to the start outside one), or nowhere once a `|` began closure
/// parameters. Attributes are measured inside but add nothing to the chain they precede.
pub(super) fn shape(tokens: TokenStream) -> std::result::Result<(), String> {
    let mut stack = vec![Chain::new(tokens, 0, 0)];
    while let Some(c) = stack.last_mut() {
        let Some(t) = c.tokens.get(c.next).cloned() else {
            stack.pop();
            continue;
        };
        let depth = c.depth + 1;
        let line = t.span().start().line;
        let too_deep = || {
            Err(format!(
                "line {line}: groups nested deeper than {MAX_DEPTH}"
            ))
        };
        if let Some(g) = attribute_at(&c.tokens, c.next).cloned() {
            if depth > MAX_DEPTH {
                return too_deep();
            }
            let base = c.base + c.length + 1;
            c.next = skip_attribute(&c.tokens, c.next);
            stack.push(Chain::new(g.stream(), depth, base));
            continue;
        }
        c.next += 1;
        c.length += 1;
        let cost = c.base + c.length;
        if cost > MAX_CHAIN {
            return Err(format!(
                "line {line}: code chained deeper than {MAX_CHAIN} tokens"
            ));
        }
        match &t {
            TokenTree::Punct(p) => c.punct(p),
            TokenTree::Group(g) => {
                if ends_statement(g, c.tokens.get(c.next)) {
                    c.restart();
                }
                if depth > MAX_DEPTH {
                    return too_deep();
                }
                stack.push(Chain::new(g.stream(), depth, cost));
            }
            _ => {}
        }
    }
    Ok(())
}

/// One group's tokens as `shape` walks them.
struct Chain {
    tokens: Vec<TokenTree>,
    next: usize,
    depth: usize,
    /// The cost of the group itself in its parent's chain.
    base: usize,
    length: usize,
    /// The chain's length at each open `<`.
    angles: Vec<usize>,
    /// A `|` since the chain began.
    barred: bool,
    previous: Option<(char, Spacing)>,
}

impl Chain {
    fn new(tokens: TokenStream, depth: usize, base: usize) -> Chain {
        Chain {
            tokens: tokens.into_iter().collect(),
            next: 0,
            depth,
            base,
            length: 0,
            angles: vec![],
            barred: false,
            previous: None,
        }
    }

    fn restart(&mut self) {
        self.length = 0;
        self.angles.clear();
        self.barred = false;
    }

    fn punct(&mut self, p: &proc_macro2::Punct) {
        let arrow = matches!(self.previous, Some(('-' | '=', Spacing::Joint)));
        match p.as_char() {
            ';' => self.restart(),
            ',' if !self.barred => self.length = self.angles.last().copied().unwrap_or(0),
            '<' => self.angles.push(self.length),
            '>' if !arrow => {
                self.angles.pop();
            }
            '|' => self.barred = true,
            _ => {}
        }
        self.previous = Some((p.as_char(), p.spacing()));
    }
}

/// A block followed by what starts an item or a statement (an identifier other than `else` or
/// `as`, an attribute, or nothing).
fn ends_statement(g: &proc_macro2::Group, next: Option<&TokenTree>) -> bool {
    g.delimiter() == Delimiter::Brace
        && match next {
            Some(TokenTree::Ident(i)) => i != "else" && i != "as",
            Some(TokenTree::Punct(p)) => p.as_char() == '#',
            None => true,
            _ => false,
        }
}

/// The bracket group of an attribute starting at `t[i]` (`#[…]` or `#![…]`).
pub(super) fn attribute_at(t: &[TokenTree], i: usize) -> Option<&proc_macro2::Group> {
    if !is_punct(t.get(i), '#') {
        return None;
    }
    let at = if is_punct(t.get(i + 1), '!') {
        i + 2
    } else {
        i + 1
    };
    match t.get(at) {
        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Bracket => Some(g),
        _ => None,
    }
}

/// The index after the attribute starting at `t[i]`.
pub(super) fn skip_attribute(t: &[TokenTree], i: usize) -> usize {
    if is_punct(t.get(i + 1), '!') {
        i + 3
    } else {
        i + 2
    }
}

pub(super) fn is_punct(t: Option<&TokenTree>, c: char) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c)
}
