-- A small bookshop: the database the SQL servers of the MCP tests and docs serve.
CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE books (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    author_id INTEGER NOT NULL REFERENCES authors(id),
    price REAL NOT NULL,
    stock INTEGER NOT NULL,
    year INTEGER NOT NULL
);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    book_id INTEGER NOT NULL REFERENCES books(id),
    quantity INTEGER NOT NULL,
    order_date TEXT NOT NULL
);
INSERT INTO authors VALUES
    (1, 'Ursula K. Le Guin', 'United States'),
    (2, 'Chinua Achebe', 'Nigeria'),
    (3, 'Wisława Szymborska', 'Poland'),
    (4, 'Machado de Assis', 'Brazil'),
    (5, 'Yasunari Kawabata', 'Japan');
INSERT INTO books VALUES
    (1, 'The Dispossessed', 1, 14.5, 7, 1974),
    (2, 'Things Fall Apart', 2, 11.25, 0, 1958),
    (3, 'View with a Grain of Sand', 3, 18.9, 3, 1995),
    (4, 'Dom Casmurro', 4, 9.75, 12, 1899),
    (5, 'Snow Country', 5, 13.4, 5, 1948),
    (6, 'A Wizard of Earthsea', 1, 10.99, 9, 1968),
    (7, 'Arrow of God', 2, 12.6, 2, 1964),
    (8, 'The Posthumous Memoirs of Bras Cubas', 4, 15.2, 4, 1881);
INSERT INTO customers VALUES
    (1, 'Amara Okafor', 'Lagos'),
    (2, 'Tomasz Nowak', 'Krakow'),
    (3, 'Beatriz Lima', 'Recife'),
    (4, 'Kenji Sato', 'Osaka');
INSERT INTO orders VALUES
    (1, 1, 2, 1, '2026-09-14'),
    (2, 2, 3, 2, '2026-10-02'),
    (3, 3, 8, 1, '2026-10-19'),
    (4, 4, 5, 3, '2026-11-05'),
    (5, 1, 7, 1, '2026-11-21'),
    (6, 3, 4, 2, '2026-12-01');
